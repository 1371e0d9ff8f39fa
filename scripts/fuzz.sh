#!/usr/bin/env bash
# Fuzzes every cargo-fuzz target of fuzz/ for SECONDS each (default 20, what CI runs) and exits
# non-zero on any finding (crash, panic, timeout, out-of-memory, leak).
#
#   scripts/fuzz.sh [SECONDS]
#
# - Installs what it needs when missing: the nightly toolchain (`rustup toolchain install nightly
#   --profile minimal --no-self-update`) and cargo-fuzz (`cargo binstall` when present, else `cargo install --locked`).
# - Builds every target in one `cargo fuzz build` (release, debug assertions, AddressSanitizer) into
#   target/fuzz, so the dependencies compile once.
# - Runs the targets one after the other, one libFuzzer process each (one core), each on a scratch
#   copy of its seeds (fuzz/corpus/<target>) plus its stored findings (fuzz/regressions/<target>,
#   replayed first): the committed corpus is never modified.
# - Prints one line per target; a finding's input is kept under target/fuzz/artifacts/<target>/
#   (reproduce: `<line's binary> <input>`), its log under target/fuzz/logs/.
# - ros_param_conversion needs the `ros` feature, built in the ROS 2 environment of
#   scripts/ros-env.sh (sourced here); LIDAR_KERNELS_SKIP_ROS=1 skips it (and builds without ROS).
#
# Knobs: FUZZ_TARGETS="a b" (a subset), FUZZ_CORPUS_DIR=DIR (grow corpora in DIR/<target> instead
# of a scratch copy), FUZZ_TARGET_DIR (default target/fuzz), FUZZ_TOOLCHAIN (default nightly; a
# dated nightly-YYYY-MM-DD pins it).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
secs="${1:-20}"
[[ "$secs" =~ ^[0-9]+$ ]] || { echo "usage: scripts/fuzz.sh [SECONDS]" >&2; exit 2; }
CARGO_FUZZ_VERSION=0.13.2
export CARGO_TARGET_DIR="${FUZZ_TARGET_DIR:-$root/target/fuzz}"
logs="$CARGO_TARGET_DIR/logs"
mkdir -p "$logs"

all_targets="cdr_pointcloud2 layout_gather mcap_reader sqlite_reader box_records config_yaml ros_param_conversion"
targets="${FUZZ_TARGETS:-$all_targets}"

# Input caps: a CDR message of 64 KB covers every layout; a bag of 1 MB, many records.
max_len() {
    case "$1" in
        mcap_reader | sqlite_reader) echo 1048576 ;;
        config_yaml) echo 16384 ;;
        ros_param_conversion) echo 4096 ;;
        *) echo 65536 ;;
    esac
}

# 1. Toolchain and cargo-fuzz.
toolchain="${FUZZ_TOOLCHAIN:-nightly}"
if ! rustup run "$toolchain" rustc --version >/dev/null 2>&1; then
    # --no-self-update: installing a toolchain must not replace the machine's rustup.
    rustup toolchain install "$toolchain" --profile minimal --no-self-update >"$logs/install.log" 2>&1 ||
        { cat "$logs/install.log" >&2; echo "fuzz: installing the nightly toolchain failed" >&2; exit 1; }
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    if cargo binstall --version >/dev/null 2>&1; then
        cargo binstall -y --force "cargo-fuzz@$CARGO_FUZZ_VERSION" >>"$logs/install.log" 2>&1
    else
        cargo install --locked --version "$CARGO_FUZZ_VERSION" cargo-fuzz >>"$logs/install.log" 2>&1
    fi || { tail -20 "$logs/install.log" >&2; echo "fuzz: installing cargo-fuzz failed" >&2; exit 1; }
fi

# 2. The ROS 2 environment for ros_param_conversion, unless skipped.
features=()
if [[ " $targets " == *" ros_param_conversion "* ]]; then
    if [[ -n "${LIDAR_KERNELS_SKIP_ROS:-}" ]]; then
        targets="$(echo " $targets " | sed 's/ ros_param_conversion / /')"
        echo "fuzz ros_param_conversion: skipped (LIDAR_KERNELS_SKIP_ROS is set)"
    else
        # shellcheck source=ros-env.sh
        source scripts/ros-env.sh 2>"$logs/ros-env.log" ||
            { cat "$logs/ros-env.log" >&2; echo "fuzz: scripts/ros-env.sh failed" >&2; exit 1; }
        features=(--features ros)
    fi
fi

# 3. One build of every target.
if ! cargo "+$toolchain" fuzz build --fuzz-dir fuzz "${features[@]}" >"$logs/build.log" 2>&1; then
    tail -40 "$logs/build.log" >&2
    echo "fuzz: build failed (log: $logs/build.log)" >&2
    exit 1
fi
bin_dir="$CARGO_TARGET_DIR/x86_64-unknown-linux-gnu/release"

# 4. Each target in turn (fuzz/lsan.supp says which leaks are not ours).
export LSAN_OPTIONS="suppressions=$root/fuzz/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
failed=0
for t in $targets; do
    if [[ -n "${FUZZ_CORPUS_DIR:-}" ]]; then corpus="$FUZZ_CORPUS_DIR/$t"; else corpus="$scratch/$t"; fi
    mkdir -p "$corpus"
    seeds=0
    for dir in "fuzz/corpus/$t" "fuzz/regressions/$t"; do
        if [[ -d "$dir" ]]; then
            cp -f "$dir"/* "$corpus"/ 2>/dev/null || true
            seeds=$((seeds + $(find "$dir" -type f | wc -l)))
        fi
    done
    art="$CARGO_TARGET_DIR/artifacts/$t"
    mkdir -p "$art"
    dict=()
    [[ -f "fuzz/dicts/$t.dict" ]] && dict=("-dict=fuzz/dicts/$t.dict")
    log="$logs/$t.log"
    start=$(date +%s)
    rc=0
    "$bin_dir/$t" "$corpus" "${dict[@]}" -max_total_time="$secs" -max_len="$(max_len "$t")" \
        -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 -artifact_prefix="$art/" >"$log" 2>&1 || rc=$?
    took=$(($(date +%s) - start))
    runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
    size="$(find "$corpus" -type f | wc -l)"
    if [[ $rc -eq 0 ]]; then
        echo "fuzz $t: ${runs:-?} runs in ${took}s, corpus $size (seeds $seeds): ok"
    else
        failed=1
        what="$(grep -m1 -oE 'ERROR: (libFuzzer|AddressSanitizer|LeakSanitizer): [a-z -]+|panicked at [^ ]+' "$log" || true)"
        input="$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -1)"
        echo "fuzz $t: FINDING after ${runs:-?} runs in ${took}s: ${what:-exit status $rc}; input ${input:-(none)}; log $log"
    fi
done
exit $failed

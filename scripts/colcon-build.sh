#!/usr/bin/env bash
# Builds lidar_kernels as a ROS 2 package with colcon (ament_cargo through colcon-ros-cargo), then
# checks the installed tree: ament index entry, share/ (package.xml, launch/, config/) and the node
# executables under lib/lidar_kernels/ (each started and stopped with SIGINT).
#
#   bash scripts/colcon-build.sh           # workspace: target/colcon_ws (src/lidar_kernels -> project)
#   COLCON_WS=/path/ws bash scripts/colcon-build.sh
#
# On the PyPI wheels (no system ROS 2) the colcon tools go into the same venv as the wheels.
# With a system ROS 2 sourced, colcon-ros-cargo is pip-installed into the user site if missing.
# There is no `ros2` CLI on PyPI: `ros2 run/launch` cannot be checked here.
set -eo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=ros-env.sh
source "$root/scripts/ros-env.sh"
set -u

ws="${COLCON_WS:-$root/target/colcon_ws}"
pkg=lidar_kernels

# 1. Tools: colcon + colcon-ros-cargo 0.2.0 (pulls colcon-cargo, colcon-ros and cargo-ament-build).
#    Not colcon-cargo-ros2 (that one is for rclrs and conflicts).
pip_cmd=(python3 -m pip)
[ -n "${LIDAR_KERNELS_ROS_WHEELS:-}" ] && pip_cmd=("$LIDAR_KERNELS_ROS_WHEELS/bin/python" -m pip)
if ! command -v colcon >/dev/null 2>&1 || ! "${pip_cmd[@]}" show colcon-ros-cargo 2>/dev/null | grep -q '^Version: 0.2.0$' ||
    ! cargo ament-build --help >/dev/null 2>&1; then
    echo "colcon-build: installing colcon-common-extensions==0.3.0 colcon-ros-cargo==0.2.0"
    "${pip_cmd[@]}" install -q --disable-pip-version-check colcon-common-extensions==0.3.0 colcon-ros-cargo==0.2.0
fi
# colcon skips an ament_cargo package without a word when this fails.
cargo ament-build --help >/dev/null || { echo "colcon-build: 'cargo ament-build' does not run" >&2; exit 1; }
[ -f "$root/package.xml" ] || { echo "colcon-build: $root/package.xml is missing" >&2; exit 1; }

# 2. Workspace: src/lidar_kernels is a link to the project.
mkdir -p "$ws/src"
ln -sfn "$root" "$ws/src/$pkg"

# 2b. colcon-ros-cargo passes `--target-dir <build base>` to cargo: a link from the build base to the
#     target dir of `source scripts/ros-env.sh && cargo build --features ros` (test/ros/run.sh) lets
#     both builds share their artifacts (same environment, same flags), so a colcon build after the
#     tests is a no-change build instead of a second cold one. LIDAR_KERNELS_COLCON_OWN_TARGET=1: no link.
if [ "${LIDAR_KERNELS_COLCON_OWN_TARGET:-0}" != 1 ]; then
    shared_target="${CARGO_TARGET_DIR:-$root/target/ros}"
    mkdir -p "$shared_target" "$ws/build"
    if [ "$(readlink "$ws/build/$pkg" 2>/dev/null)" != "$shared_target" ]; then
        rm -rf "$ws/build/$pkg"
        ln -s "$shared_target" "$ws/build/$pkg"
    fi
fi

# 3. Build (release). Run from the workspace root.
t0=$(date +%s)
# Plain, as a ROS user runs it: colcon.pkg adds `--features ros`.
(cd "$ws" && colcon build --packages-select "$pkg" --cargo-args --release)
echo "colcon build: $(( $(date +%s) - t0 )) s"

# 4. Check the installed tree. (install/setup.bash fails under `set -u`; prefix the path directly.)
install="$ws/install/$pkg"
export AMENT_PREFIX_PATH="$install${AMENT_PREFIX_PATH:+:$AMENT_PREFIX_PATH}"
python3 - "$root" <<'EOF'
import os, sys
from ament_index_python.packages import get_package_share_directory, get_package_prefix
root = sys.argv[1]
share = get_package_share_directory('lidar_kernels')
prefix = get_package_prefix('lidar_kernels')
print('share:', share)
problems = []
if not os.path.isfile(os.path.join(share, 'package.xml')):
    problems.append('share/package.xml missing')
for d in ('launch', 'config'):
    src_files = sorted(os.path.relpath(os.path.join(dp, f), os.path.join(root, d))
                       for dp, _, fs in os.walk(os.path.join(root, d)) for f in fs)
    inst = os.path.join(share, d)
    inst_files = sorted(os.path.relpath(os.path.join(dp, f), inst)
                        for dp, _, fs in os.walk(inst) for f in fs) if os.path.isdir(inst) else None
    if not src_files:
        print(f'{d}/: empty in the project (nothing to install)')
    elif inst_files is None or set(src_files) - set(inst_files):
        problems.append(f'{d}/ not installed completely: {src_files} vs {inst_files}')
    else:
        print(f'{d}/: {len(inst_files)} files installed')
for b in ('voxelizer', 'sampler', 'neighbors', 'nms', 'pipeline', 'detector'):
    exe = os.path.join(prefix, 'lib', 'lidar_kernels', b)
    if not os.access(exe, os.X_OK):
        problems.append(f'lib/lidar_kernels/{b} missing or not executable')
print('\n'.join('PROBLEM: ' + p for p in problems) or 'installed tree: ok')
sys.exit(1 if problems else 0)
EOF

# 5. Each installed executable starts (reaches its subscription) and stops cleanly on SIGINT.
export ROS_DOMAIN_ID="${ROS_DOMAIN_ID:-$(( 10 + $$ % 90 ))}"
export ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST
logdir="$ws/log/lk-start"
mkdir -p "$logdir"
fail=0
for b in voxelizer sampler neighbors nms pipeline detector; do
    log="$logdir/$b.log"
    "$install/lib/$pkg/$b" --ros-args -r __node:="lk_colcon_$b" >"$log" 2>&1 &
    p=$!
    ok=1
    for _ in $(seq 300); do grep -q "input '" "$log" && { ok=0; break; }; kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -INT "$p" 2>/dev/null || true
    rc=0
    for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$p" 2>/dev/null; then kill -KILL "$p"; rc=124; fi
    wait "$p" || rc=$?
    if [ "$ok" = 0 ] && [ "$rc" = 0 ]; then echo "PASS installed $b runs"; else echo "FAIL installed $b (rc $rc): $(tail -3 "$log")"; fail=1; fi
done
# 6. The installed nodes accept the installed params files (backend auto falls back to the CPU here),
#    and the launch files' default params file is installed.
share="$install/share/$pkg"
if [ -f "$share/config/auto.param.yaml" ] &&
    grep -q 'find-pkg-share lidar_kernels)/config/auto.param.yaml' "$share/launch/pipeline.launch.xml"; then echo "PASS installed launch files' default params file is installed"; else echo "FAIL launch default params file"; fail=1; fi
for f in "$share"/config/*.param.yaml; do
    n=$(basename "$f" .param.yaml)
    log="$logdir/params-$n.log"
    "$install/lib/$pkg/pipeline" --ros-args -r __node:="lk_colcon_pf_$n" --params-file "$f" >"$log" 2>&1 &
    p=$!
    ok=1
    for _ in $(seq 300); do grep -q "input '" "$log" && { ok=0; break; }; kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -INT "$p" 2>/dev/null || true
    rc=0
    for _ in $(seq 100); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$p" 2>/dev/null; then kill -KILL "$p"; rc=124; fi
    wait "$p" || rc=$?
    if [ "$ok" = 0 ] && [ "$rc" = 0 ]; then
        echo "PASS installed pipeline starts with share/$pkg/config/$n.param.yaml ($(grep -o 'backend: .*' "$log" | head -1))"
    else
        echo "FAIL installed pipeline with $n.param.yaml (rc $rc): $(tail -3 "$log")"; fail=1
    fi
done
echo "install: $install"
exit "$fail"

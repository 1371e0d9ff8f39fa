#!/usr/bin/env bash
# `cargo check` of the library and the lidar-kernels CLI for aarch64-unknown-linux-gnu (Jetson
# Orin / Xavier), from x86_64: the Rust target through rustup, and a C cross compiler for the
# crates that build C (sqlite in rusqlite, zstd, lz4) through apt when missing (root, as on CI).
# The `ros` feature is not checked: it needs the ROS 2 headers and libraries of the target.
set -euo pipefail
cd "$(dirname "$0")/.."
target=aarch64-unknown-linux-gnu
rustup target list --installed | grep -qx "$target" || rustup target add "$target"
if ! command -v aarch64-linux-gnu-gcc >/dev/null; then
    if [ "$(id -u)" = 0 ]; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc-aarch64-linux-gnu >/dev/null 2>&1 ||
            { apt-get update -qq >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gcc-aarch64-linux-gnu >/dev/null; }
    else
        echo "check-aarch64: needs aarch64-linux-gnu-gcc (apt-get install gcc-aarch64-linux-gnu)" >&2
        exit 1
    fi
fi
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
cargo check --release --quiet --target "$target" --lib --bin lidar-kernels
echo "aarch64: library and CLI check clean for $target"

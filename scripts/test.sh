#!/usr/bin/env bash
# The project's test command (README, .ci/run). Needs no GPU and no system ROS 2:
#  1. cargo tests (codec, operators vs brute-force oracles, bags, config, replay, GPU host logic);
#  2. the bundled sample bag and the replay output read back by the Python `rosbags` package;
#  3. every CUDA kernel compiled by NVRTC 12.9 (PyPI wheel) for sm_72, sm_87 and sm_90;
#  3b. `cargo check --target aarch64-unknown-linux-gnu` of the library and the CLI (Jetson);
#  4. with LIDAR_KERNELS_SKIP_ROS unset: ROS 2 Jazzy from PyPI wheels, the nodes built with the `ros`
#     feature and tested over real DDS against an rclpy peer, and the colcon install checked;
#  5. every cargo-fuzz target for 20 s (scripts/fuzz.sh, a pinned nightly and cargo-fuzz it installs).
set -euo pipefail
cd "$(dirname "$0")/.."
step() { printf '\n==== %s\n' "$*"; }

step "cargo test"
cargo test --release --all-targets

step "sample bag and replay output read back with rosbags"
test/python/run.sh
rm -rf target/ci/replay_out
cargo run --release --quiet -- replay --quiet --out target/ci/replay_out
.venv-py/bin/python test/python/check_sample_bag.py target/ci/replay_out --no-scans --any-layout \
    --points-topic /lidar_kernels/samples \
    --topics /lidar_kernels/voxels /lidar_kernels/voxel_features /lidar_kernels/downsampled /lidar_kernels/samples /lidar_kernels/neighborhoods
rm -rf target/ci/replay_detect target/ci/render
cargo run --release --quiet -- replay --quiet --render target/ci/render --out target/ci/replay_detect
.venv-py/bin/python test/python/check_sample_bag.py target/ci/replay_detect --no-scans --any-layout \
    --points-topic /lidar_kernels/detections \
    --topics /lidar_kernels/clusters /lidar_kernels/markers /lidar_kernels/detections_3d
.venv-py/bin/python test/python/check_png.py target/ci/render 4

step "NVRTC: every kernel x every profile x sm_72/sm_87/sm_90"
scripts/install-nvrtc.sh >/dev/null
eval "$(scripts/install-nvrtc.sh --print-env)"
cargo run --release --quiet -- nvrtc-check

step "aarch64 (Jetson): cargo check of the library and the CLI"
scripts/check-aarch64.sh

if [[ -z "${LIDAR_KERNELS_SKIP_ROS:-}" && -x test/ros/run.sh ]]; then
    step "ROS 2 nodes over DDS"
    test/ros/run.sh
    if [[ -x scripts/colcon-build.sh ]]; then
        step "colcon build and installed tree"
        scripts/colcon-build.sh
    fi
fi
step "fuzzing: every target for 20 s"
FUZZ_TOOLCHAIN="${FUZZ_TOOLCHAIN:-nightly-2026-05-20}" scripts/fuzz.sh 20

step "all tests passed"

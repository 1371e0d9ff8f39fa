#!/usr/bin/env bash
# Cross-checks the bags lidar_kernels writes with the independent Python `rosbags` reader.
# Creates .venv-py (pinned versions), writes the sample bag through the Rust test
# `write_sample_bag_for_python`, and runs check_sample_bag.py on it. Extra arguments go to the
# checker. Needs python3 (>= 3.10) with venv, and network access the first time (pip).
set -euo pipefail
cd "$(dirname "$0")/../.."

ROSBAGS_VERSION=0.11.9
NUMPY_VERSION=2.2.6
VENV=.venv-py

if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
installed() { "$VENV/bin/pip" show "$1" 2>/dev/null | sed -n 's/^Version: //p'; }
if [ "$(installed rosbags)" != "$ROSBAGS_VERSION" ] || [ "$(installed numpy)" != "$NUMPY_VERSION" ]; then
    "$VENV/bin/pip" install --quiet "rosbags==$ROSBAGS_VERSION" "numpy==$NUMPY_VERSION"
fi

OUT="${BAG_SAMPLE_OUT:-$PWD/target/python-check}"
mkdir -p "$OUT"
BAG_SAMPLE_OUT="$OUT" cargo test --release --test bag write_sample_bag_for_python -- --ignored --nocapture
BAG="$OUT/ouster_sample"
echo "checking $BAG with rosbags $ROSBAGS_VERSION"
"$VENV/bin/python" test/python/check_sample_bag.py "$BAG" "$@"

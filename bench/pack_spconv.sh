#!/bin/sh
# Packs spconv-cu126 2.3.8 and cumm-cu126 0.7.11, unzipped, into one xz tarball for a machine
# that cannot download them (the GPU machine): 97 MB of wheels become ~40 MB, under the 64 MiB
# one run there can carry. Dependencies that are pure Python go beside it as wheels.
#   bench/pack_spconv.sh 3.12 OUT_DIR       # the GPU machine's Python version
# There: tar xJf OUT_DIR/spconv.tar.xz -C /tmp/sp && pip install --no-index --find-links OUT_DIR/deps \
#          --target /tmp/sp pccm ccimport fire pybind11 && PYTHONPATH=/tmp/sp python3 bench/gpu_peers.py ...
set -eu
py=${1:?python version, e.g. 3.12}
out=${2:?output folder}
tag=cp$(echo "$py" | tr -d .)
work=$(mktemp -d)
mkdir -p "$out/deps"
pip download -q --no-deps --python-version "$py" --only-binary=:all: --platform manylinux_2_28_x86_64 \
    -d "$work/wheels" spconv-cu126==2.3.8 cumm-cu126==0.7.11
pip download -q --python-version "$py" --only-binary=:all: --platform manylinux_2_28_x86_64 \
    --platform manylinux2014_x86_64 -d "$out/deps" pccm ccimport fire pybind11
mkdir "$work/tree"
for w in "$work"/wheels/*"$tag"*.whl; do (cd "$work/tree" && python3 -m zipfile -e "$w" .); done
tar cf - -C "$work/tree" . | xz -T0 -9 > "$out/spconv.tar.xz"
rm -rf "$work"
ls -l "$out/spconv.tar.xz"

#!/usr/bin/env bash
# Installs a CUDA 12.9 NVRTC (no GPU, no CUDA toolkit needed) into .venv-nvrtc so that the kernels
# can be compiled for sm_72 (Xavier), sm_87 (Orin) and sm_90 (H100/H200) on any x86_64 machine:
# CUDA 13's NVRTC dropped sm_72, and no nvcc for sm_72 exists on PyPI.
#
# Usage: scripts/install-nvrtc.sh [VENV_DIR]   (default: .venv-nvrtc in the repository root)
# Then:  eval "$(scripts/install-nvrtc.sh --print-env)"   or copy the printed export line.
set -euo pipefail

NVRTC_WHEEL="nvidia-cuda-nvrtc-cu12==12.9.86"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PRINT_ONLY=0
if [[ "${1:-}" == "--print-env" ]]; then PRINT_ONLY=1; shift; fi
VENV="${1:-$ROOT/.venv-nvrtc}"

lib_dir() {
    "$VENV/bin/python" - <<'PY'
import importlib.util, os, sys
spec = importlib.util.find_spec("nvidia")
if spec is None or not spec.submodule_search_locations:
    sys.exit("nvidia namespace package not found in the venv")
for base in spec.submodule_search_locations:
    d = os.path.join(base, "cuda_nvrtc", "lib")
    if os.path.isdir(d):
        print(d)
        break
else:
    sys.exit("nvidia/cuda_nvrtc/lib not found in the venv")
PY
}

if [[ $PRINT_ONLY -eq 0 ]]; then
    if [[ ! -x "$VENV/bin/python" ]]; then
        echo "creating $VENV" >&2
        python3 -m venv "$VENV"
    fi
    if ! "$VENV/bin/python" -m pip show nvidia-cuda-nvrtc-cu12 2>/dev/null | grep -q '^Version: 12.9.86$'; then
        "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "$NVRTC_WHEEL" >&2
    fi
fi

LIB="$(lib_dir)"
# cudarc built with cuda-12080 dlopens libnvrtc.so, then libnvrtc.so.12, .so.11, ...: the wheel's
# libnvrtc.so.12 is found as is. An unversioned libnvrtc.so symlink is still added (harmless, and it
# makes `-lnvrtc`-style lookups and older loaders work); NVRTC itself dlopens
# libnvrtc-builtins.so.12.9 by name, so the folder must be on LD_LIBRARY_PATH.
if [[ ! -e "$LIB/libnvrtc.so" ]]; then
    ln -s libnvrtc.so.12 "$LIB/libnvrtc.so"
fi
if [[ $PRINT_ONLY -eq 0 ]]; then
    echo "NVRTC 12.9 installed in $LIB" >&2
    echo "run this (or add it to your shell profile):" >&2
fi
echo "export LD_LIBRARY_PATH=\"$LIB\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}\""

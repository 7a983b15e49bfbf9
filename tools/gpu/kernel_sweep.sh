#!/usr/bin/env bash
# The simulator's kernel efficiency sweep (tools/gpu/kernel_sweep.py, packed
# in extra/) on this machine's GPU, in the host's Python that has torch
# (torch_env.sh): GEMMs by shape, dtype and layout, SDPA attention by shape
# and backend, memory-bound kernels by bytes, launch costs.
#
#   gpu-pkg/kernel_sweep.sh            # full sweep, a few minutes on an H100
#   gpu-pkg/kernel_sweep.sh --quick    # about a minute
#
# Writes kernel_sweep.json into $OUT (the device tool's returned folder), or
# the current directory.
set -euo pipefail
PKG=$(cd "$(dirname "$0")" && pwd)
source "$PKG/torch_env.sh"  # sets TORCH_PY, SK_HOST_LIBDIR, SK_HOST_LIBPATH
trap 'rm -rf "$SK_HOST_LIBDIR"' EXIT
"$TORCH_PY" "$PKG/extra/kernel_sweep.py" --out "${OUT:-.}/kernel_sweep.json" "$@"

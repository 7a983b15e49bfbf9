#!/usr/bin/env bash
# Runs the optional PyTorch comparison (benchmarks/torch_compare/compare.py,
# packed as extra/compare.py) on the GPU host's CPU with the package's
# libshardkit.so, in the host's Python that has torch:
#
#   gpu-pkg/torch_compare.sh --models=gpt-10m --worlds=16 --reps=1 [--dtype bf16]
#
# The Python and the library path: torch_env.sh ($SK_TORCH_PYTHON, else the
# first of /opt/torch/.venv/bin/python and python3 that imports torch).
set -euo pipefail
PKG=$(cd "$(dirname "$0")" && pwd)
source "$PKG/torch_env.sh"  # sets TORCH_PY, SK_HOST_LIBDIR, SK_HOST_LIBPATH
trap 'rm -rf "$SK_HOST_LIBDIR"' EXIT
export LD_LIBRARY_PATH="$SK_HOST_LIBPATH"
"$TORCH_PY" "$PKG/extra/compare.py" --lib "$PKG/lib/libshardkit.so" --torch_python "$TORCH_PY" "$@"

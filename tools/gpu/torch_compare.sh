#!/usr/bin/env bash
# Runs the optional PyTorch comparison (benchmarks/torch_compare/compare.py,
# packed as extra/compare.py) on the GPU host's CPU with the package's
# libshardkit.so, in the host's Python that has torch:
#
#   gpu-pkg/torch_compare.sh --models=gpt-10m --worlds=16 --reps=1 [--dtype bf16]
#
# The Python is $SK_TORCH_PYTHON, else the first of /opt/torch/.venv/bin/python
# and python3 that imports torch. Python runs on the host's own loader and
# glibc, so libshardkit.so cannot come through the packed loader as run.sh's
# binaries do: it is loaded by ctypes with a library path of the package's
# libraries minus glibc's and the compiler runtime's (the host's own are
# newer and backward compatible; Debian 12's glibc 2.36 under a newer loader
# would not load), then the host's CUDA libraries (libpath.sh).
set -euo pipefail
PKG=$(cd "$(dirname "$0")" && pwd)
py=${SK_TORCH_PYTHON:-}
if [[ -z "$py" ]]; then
  for c in /opt/torch/.venv/bin/python python3; do
    if command -v "$c" >/dev/null && "$c" -c "import torch" 2>/dev/null; then
      py=$c
      break
    fi
  done
fi
[[ -n "$py" ]] || { echo "torch_compare.sh: no Python with torch here (set SK_TORCH_PYTHON)" >&2; exit 1; }

libs=$(mktemp -d)
trap 'rm -rf "$libs"' EXIT
for f in "$PKG"/lib/*; do
  case $(basename "$f") in
    ld-linux-x86-64.so.2 | libc.so.6 | libm.so.6 | libpthread.so.0 | libdl.so.2 | librt.so.1 | \
      libgcc_s.so.1 | libstdc++.so.6 | libz.so.1 | liblzma.so.5) continue ;;
  esac
  ln -s "$f" "$libs/"
done
source "$PKG/libpath.sh"  # sets LIBPATH: $PKG/lib first, then the CUDA directories
export LD_LIBRARY_PATH="$libs${LIBPATH#"$PKG/lib"}"
exec "$py" "$PKG/extra/compare.py" --lib "$PKG/lib/libshardkit.so" --torch_python "$py" "$@"

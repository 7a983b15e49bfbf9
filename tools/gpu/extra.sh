#!/usr/bin/env bash
# Runs one of the package's extra/ tools (CPU benchmarks packed for the GPU
# host's cores) through the packed loader, with the same library path as
# run.sh.   gpu-pkg/extra.sh NAME [ARGS...]
set -euo pipefail
PKG=$(cd "$(dirname "$0")" && pwd)
name=$1
shift
[[ -x "$PKG/extra/$name" ]] || { echo "extra.sh: no extra/$name in this package" >&2; exit 1; }
source "$PKG/libpath.sh"  # sets LIBPATH
exec "$PKG/lib/ld-linux-x86-64.so.2" --library-path "$LIBPATH" "$PKG/extra/$name" "$@"

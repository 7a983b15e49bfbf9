# Sourced by torch_compare.sh and gpu_vs_torch.sh (with PKG set to the
# package): finds the host's Python that has torch and the library path on
# which that Python loads the package's libshardkit.so. Sets
#   TORCH_PY         $SK_TORCH_PYTHON, else the first of
#                    /opt/torch/.venv/bin/python and python3 that imports torch;
#   SK_HOST_LIBDIR   a temporary directory the caller removes: links to the
#                    package's libraries minus glibc's and the compiler
#                    runtime's (Python runs on the host's own loader and glibc,
#                    so libshardkit.so cannot come through the packed loader
#                    as run.sh's binaries do; the host's glibc and libstdc++
#                    are newer and backward compatible, while Debian 12's
#                    glibc 2.36 under a newer loader would not load);
#   SK_HOST_LIBPATH  SK_HOST_LIBDIR, then the host's CUDA libraries (libpath.sh).
TORCH_PY=${SK_TORCH_PYTHON:-}
if [[ -z "$TORCH_PY" ]]; then
  for c in /opt/torch/.venv/bin/python python3; do
    if command -v "$c" >/dev/null && "$c" -c "import torch" 2>/dev/null; then
      TORCH_PY=$c
      break
    fi
  done
fi
[[ -n "$TORCH_PY" ]] || { echo "$(basename "$0"): no Python with torch here (set SK_TORCH_PYTHON)" >&2; exit 1; }

SK_HOST_LIBDIR=$(mktemp -d)
for f in "$PKG"/lib/*; do
  case $(basename "$f") in
    ld-linux-x86-64.so.2 | libc.so.6 | libm.so.6 | libpthread.so.0 | libdl.so.2 | librt.so.1 | \
      libgcc_s.so.1 | libstdc++.so.6 | libz.so.1 | liblzma.so.5) continue ;;
  esac
  ln -s "$f" "$SK_HOST_LIBDIR/"
done
source "$PKG/libpath.sh"  # sets LIBPATH: $PKG/lib first, then the CUDA directories
SK_HOST_LIBPATH="$SK_HOST_LIBDIR${LIBPATH#"$PKG/lib"}"

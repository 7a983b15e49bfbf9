# Sourced by run.sh and extra.sh with PKG set: sets LIBPATH to the package's
# lib/, then the host's CUDA libraries (cuBLAS, cuBLASLt, NCCL of CUDA 13)
# found under $CUDA_HOME, /usr/local/cuda*, or a Python environment's nvidia-*
# wheels (PyTorch's), then the driver's directory.
# Sourced by hand (`PKG=... source gpu-pkg/libpath.sh` was needed; a bare
# `source gpu-pkg/libpath.sh` stopped with "PKG: unbound variable" on the
# H200 on 27 Nov): PKG defaults to this file's directory.
PKG=${PKG:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}
# Directories holding the CUDA libraries the package leaves out.
cuda_dirs=()
add_dir() { [[ -d "$1" ]] && cuda_dirs+=("$1"); }
for d in "${CUDA_HOME:-}/lib64" /usr/local/cuda/lib64 /usr/local/cuda-13*/lib64 \
         /usr/local/cuda/targets/x86_64-linux/lib; do
  [[ -n "$d" ]] && compgen -G "$d/libcublasLt.so.13*" >/dev/null && add_dir "$d"
done
for py in python3 python; do
  command -v "$py" >/dev/null || continue
  while read -r d; do add_dir "$d"; done < <("$py" - <<'PY' 2>/dev/null
import glob, os, site, sys
roots = set(site.getsitepackages() + [site.getusersitepackages()] + sys.path)
for r in roots:
    for d in glob.glob(os.path.join(r, "nvidia", "*", "lib")) + glob.glob(os.path.join(r, "nvidia", "cu13", "lib")):
        if glob.glob(os.path.join(d, "libcublas*.so.13*")) or glob.glob(os.path.join(d, "libnccl.so.2*")):
            print(d)
PY
)
  break
done
driver_dir=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 / {print $NF; exit}' | xargs -r dirname)
[[ -n "$driver_dir" ]] && cuda_dirs+=("$driver_dir")
LIBPATH=$PKG/lib
for d in "${cuda_dirs[@]}"; do LIBPATH+=":$d"; done


# Sourced by run.sh and extra.sh with PKG set: sets LIBPATH to the package's
# lib/, then the host's CUDA libraries (cuBLAS, cuBLASLt, NCCL of CUDA 13,
# cuDNN 9) found under $CUDA_HOME, /usr/local/cuda*, or a Python
# environment's nvidia-* wheels (PyTorch's: nvidia/cudnn/lib holds
# libcudnn.so.9 on the lent H200s, whose /usr/local/cuda has none), then the
# driver's directory. cuDNN is opened with dlopen by the fused attention and
# itself opens its engine libraries (libcudnn_engines_*, libcudnn_graph)
# from the same directory, so that directory must be on the path.
# Sourced by hand (`PKG=... source gpu-pkg/libpath.sh` was needed; a bare
# `source gpu-pkg/libpath.sh` stopped with "PKG: unbound variable" on the
# H200 on 27 Nov): PKG defaults to this file's directory.
PKG=${PKG:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}
# Directories holding the CUDA libraries the package leaves out.
cuda_dirs=()
add_dir() { [[ -d "$1" ]] && cuda_dirs+=("$1"); }
for d in "${CUDA_HOME:-}/lib64" /usr/local/cuda/lib64 /usr/local/cuda-13*/lib64 \
         /usr/local/cuda/targets/x86_64-linux/lib; do
  [[ -n "$d" ]] || continue
  if compgen -G "$d/libcublasLt.so.13*" >/dev/null || compgen -G "$d/libcudnn.so.9*" >/dev/null; then
    add_dir "$d"
  fi
done
for py in python3 python; do
  command -v "$py" >/dev/null || continue
  while read -r d; do add_dir "$d"; done < <("$py" - <<'PY' 2>/dev/null
import glob, os, site, sys
roots = set(site.getsitepackages() + [site.getusersitepackages()] + sys.path)
for r in roots:
    for d in glob.glob(os.path.join(r, "nvidia", "*", "lib")) + glob.glob(os.path.join(r, "nvidia", "cu13", "lib")):
        if (glob.glob(os.path.join(d, "libcublas*.so.13*")) or glob.glob(os.path.join(d, "libnccl.so.2*"))
                or glob.glob(os.path.join(d, "libcudnn.so.9*"))):
            print(d)
PY
)
  break
done
# cuDNN of a virtual environment that is not the python3 on PATH (PyTorch's
# at /opt/torch/.venv on the lent machines, or $SK_TORCH_PYTHON's).
venvs=("${VIRTUAL_ENV:-}" /opt/torch/.venv)
[[ -n "${SK_TORCH_PYTHON:-}" ]] && venvs+=("$(dirname "$(dirname "$SK_TORCH_PYTHON")")")
for v in "${venvs[@]}"; do
  [[ -n "$v" ]] || continue
  for d in "$v"/lib/python3*/site-packages/nvidia/cudnn/lib; do
    [[ " ${cuda_dirs[*]} " == *" $d "* ]] && continue
    compgen -G "$d/libcudnn.so.9*" >/dev/null && add_dir "$d"
  done
done
driver_dir=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 / {print $NF; exit}' | xargs -r dirname)
[[ -n "$driver_dir" ]] && cuda_dirs+=("$driver_dir")
LIBPATH=$PKG/lib
for d in "${cuda_dirs[@]}"; do LIBPATH+=":$d"; done


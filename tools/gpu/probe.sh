#!/usr/bin/env bash
# What the GPU machine has, in a few seconds of device time: the GPU and
# driver, the Python environment (PyTorch, its CUDA, cuDNN and NCCL), the
# CUDA libraries on disk, and whether several NCCL ranks can share the one
# GPU (NCCL_HOSTID per rank, and NCCL_MULTI_RANK_GPU_ENABLE=1), checked
# with torch.distributed. Run it first in a device session:
#   tools/gpu/probe.sh            # prints everything; nothing is written
set -uo pipefail
echo "== gpu"; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
echo "== cpu"; nproc; grep -m1 'model name' /proc/cpuinfo
echo "== python"; command -v python3; python3 --version
python3 - <<'PY'
import torch, os
print("torch", torch.__version__, "cuda", torch.version.cuda)
print("cudnn", torch.backends.cudnn.version())
print("nccl", torch.cuda.nccl.version())
print("device", torch.cuda.get_device_name(0))
import importlib.metadata as md
for d in md.distributions():
    n = d.metadata["Name"] or ""
    if n.startswith("nvidia") or n in ("triton", "transformers"):
        print("pkg", n, d.version)
PY
echo "== libraries"
ls /usr/local/cuda*/lib64 2>/dev/null | grep -E 'nccl|cudnn\.so|cublasLt\.so' | sort -u
python3 - <<'PY'
import glob, site, os
for r in site.getsitepackages():
    for p in sorted(glob.glob(os.path.join(r, "nvidia", "*", "lib", "*.so*"))):
        if any(k in p for k in ("nccl", "cudnn.so", "cublasLt", "cudart")): print(p)
PY
echo "== nccl ranks sharing one GPU"
cat > /tmp/share.py <<'PY'
import os, sys, torch, torch.distributed as dist
dist.init_process_group("nccl", timeout=__import__("datetime").timedelta(seconds=40))
r = dist.get_rank(); torch.cuda.set_device(0)
x = torch.full((1 << 20,), float(r + 1), device="cuda")
dist.all_reduce(x); torch.cuda.synchronize()
w = dist.get_world_size()
print(f"rank {r}: all_reduce {x[0].item()} expected {w*(w+1)/2}", flush=True)
dist.destroy_process_group()
PY
for mode in hostid multi; do
  for n in 2 4; do
    echo "-- $mode world $n"
    pids=()
    for r in $(seq 0 $((n-1))); do
      env RANK=$r WORLD_SIZE=$n LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$((29600+n)) \
        NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 NCCL_DEBUG=WARN \
        $( [[ $mode == hostid ]] && echo NCCL_HOSTID=skrank$r || echo NCCL_MULTI_RANK_GPU_ENABLE=1 ) \
        timeout 60 python3 /tmp/share.py 2>&1 | tail -3 &
      pids+=($!)
    done
    wait "${pids[@]}"
  done
done
echo "== torch.compile and cuDNN attention"
timeout 120 python3 - <<'PY'
import time, torch
from torch.nn.attention import sdpa_kernel, SDPBackend
q = torch.randn(8, 16, 1024, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
for be in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION):
    try:
        with sdpa_kernel(be):
            o = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True); o.sum().backward()
        print("sdpa", be, "ok")
    except Exception as e:
        print("sdpa", be, "failed:", str(e)[:200])
t = time.time()
f = torch.compile(lambda a: torch.nn.functional.gelu(a) * 2)
f(torch.randn(1024, device="cuda")); torch.cuda.synchronize()
print(f"torch.compile ok in {time.time()-t:.1f} s")
PY

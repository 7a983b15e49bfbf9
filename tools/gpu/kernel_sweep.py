#!/usr/bin/env python3
"""Kernel efficiency sweep for the simulator's GPU profiles (issue 46).

Measures, on the GPU this runs on, what runtime/sim/profiles/*.json price:
each op kind's achieved fraction of the datasheet peak as a function of its
shape and dtype, and the fixed costs around kernels. Needs only a Python with
torch (the GPU host's, tools/gpu/torch_env.sh finds it); no Bazel, no
shardkit build:

    python3 tools/gpu/kernel_sweep.py --out $OUT/kernel_sweep.json [--quick]
    gpu-pkg/kernel_sweep.sh  (packed by tools/gpu/package.sh: the same, into $OUT)

What it measures (CUDA events around each call, the median of --reps after
--warmup calls; every row says the shape, dtype, seconds and the achieved
rate):
  gemm        C = op(A) op(B), bf16/f16 (f32 accumulate) and f32, for M, N, K
              from the transformer shapes of 1B-70B decoders (tokens per
              micro-batch x d_model x {d_model, 3 d_model, d_ff}) and squares,
              in the NN, NT and TN layouts a training step uses (forward,
              input gradient, weight gradient)
  attention   torch SDPA forward and forward+backward, causal, per backend
              (flash, cuDNN where PyTorch has it, memory-efficient), by batch,
              heads, sequence and head size; FLOPs counted as the simulator
              counts them (4 x pairs x head_dim forward, 2.5x that backward)
  memory      bandwidth of the memory-bound kernel kinds by bytes: copy, add,
              a LayerNorm forward and backward, GELU, AdamW (fused), from 64 KiB
              to 1 GiB
  launch      the device time of an empty kernel (a 1-element add) and the host
              time per launch in a loop of 10,000 (the profile's
              kernel_overhead_us and launch_overhead_us)

The JSON's "device" block records the GPU, clocks, driver, torch and CUDA
versions. Turn its rows into profile numbers by hand, with the file named as
the source; nothing here is fitted to an end-to-end training throughput.
"""
import argparse
import json
import math
import statistics
import sys
import time


def timed(torch, fn, warmup, reps):
    """Median device seconds of fn() over `reps` calls (CUDA events)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times), min(times), max(times)


def gemm_rows(torch, args, peaks):
    dtypes = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}
    shapes = set()
    # (d_model, d_ff) of 1B-70B decoders (GPT-2 4x and Llama SwiGLU widths).
    for d, ff in [(2048, 8192), (4096, 11008), (4096, 14336), (5120, 13824), (8192, 28672)]:
        for tokens in ([4096, 8192] if args.quick else [2048, 4096, 8192, 16384]):
            shapes.add((tokens, d, d))
            shapes.add((tokens, 3 * d, d))
            shapes.add((tokens, ff, d))
            shapes.add((tokens, d, ff))
    for n in ([4096] if args.quick else [1024, 2048, 4096, 8192]):
        shapes.add((n, n, n))
    rows = []
    for name in (["bf16"] if args.quick else ["bf16", "f16", "f32"]):
        t = dtypes[name]
        for m, n, k in sorted(shapes):
            for layout in (["NN"] if args.quick else ["NN", "NT", "TN"]):
                a = torch.randn((k, m) if layout == "TN" else (m, k), device="cuda", dtype=t)
                b = torch.randn((n, k) if layout == "NT" else (k, n), device="cuda", dtype=t)
                op_a = a.t() if layout == "TN" else a
                op_b = b.t() if layout == "NT" else b
                med, lo, hi = timed(torch, lambda: torch.matmul(op_a, op_b), args.warmup, args.reps)
                flops = 2.0 * m * n * k
                rows.append({"op": "gemm", "dtype": name, "m": m, "n": n, "k": k, "layout": layout,
                             "seconds": med, "seconds_min": lo, "seconds_max": hi,
                             "tflops": flops / med / 1e12,
                             "fraction_of_peak": flops / med / peaks[name] if peaks.get(name) else None})
                del a, b
    return rows


def attention_rows(torch, args, peak_bf16):
    import torch.nn.functional as F
    backends = {}
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backends = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION}
        if hasattr(SDPBackend, "CUDNN_ATTENTION"):
            backends["cudnn"] = SDPBackend.CUDNN_ATTENTION
    except ImportError:
        sdpa_kernel = None
    rows = []
    configs = []
    for hd, heads in [(64, 32), (128, 16), (128, 32), (128, 64)]:
        for seq in ([2048, 8192] if args.quick else [512, 1024, 2048, 4096, 8192, 16384]):
            batch = max(1, 16384 // seq)
            configs.append((batch, heads, seq, hd))
    for name, backend in (backends.items() if backends else [("default", None)]):
        for batch, heads, seq, hd in configs:
            q = torch.randn(batch, heads, seq, hd, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            k = torch.randn_like(q, requires_grad=True)
            v = torch.randn_like(q, requires_grad=True)
            pairs = batch * heads * seq * (seq + 1) / 2
            fwd_flops = 4.0 * pairs * hd
            row = {"op": "attention", "backend": name, "batch": batch, "heads": heads, "seq": seq,
                   "head_dim": hd, "causal": True, "dtype": "bf16"}
            try:
                ctx = sdpa_kernel(backend) if backend is not None else None

                def fwd():
                    if ctx is None:
                        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    with sdpa_kernel(backend):
                        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

                out = fwd()
                grad = torch.randn_like(out)

                def fwd_bwd():
                    o = fwd()
                    o.backward(grad)

                f, _, _ = timed(torch, fwd, args.warmup, args.reps)
                fb, _, _ = timed(torch, fwd_bwd, args.warmup, args.reps)
                b = max(fb - f, 1e-9)
                row.update({"fwd_seconds": f, "bwd_seconds": b,
                            "fwd_tflops": fwd_flops / f / 1e12, "bwd_tflops": 2.5 * fwd_flops / b / 1e12,
                            "fwd_fraction_of_peak": fwd_flops / f / peak_bf16,
                            "bwd_fraction_of_peak": 2.5 * fwd_flops / b / peak_bf16})
            except Exception as e:  # a backend that refuses the shape says so in its row
                row["error"] = str(e).splitlines()[0][:200]
            rows.append(row)
            del q, k, v
    return rows


def memory_rows(torch, args, bandwidth):
    import torch.nn.functional as F
    rows = []
    sizes = [1 << p for p in (range(16, 31, 4) if args.quick else range(16, 31, 2))]  # bytes of one bf16 operand
    for size in sizes:
        n = size // 2
        x = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        y = torch.empty_like(x)
        cols = 4096 if n >= 4096 else n
        rows_2d = max(1, n // cols)
        x2 = x[: rows_2d * cols].view(rows_2d, cols).clone().requires_grad_(True)
        w = torch.ones(cols, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        bias = torch.zeros(cols, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn_like(x2)
        p = torch.randn(n, device="cuda", dtype=torch.float32)
        cases = {
            "copy": (lambda: y.copy_(x), 4.0 * n),
            "add": (lambda: torch.add(x, x, out=y), 6.0 * n),
            "gelu_fwd": (lambda: F.gelu(x, approximate="tanh"), 4.0 * n),
            "layer_norm_fwd": (lambda: F.layer_norm(x2, (cols,), w, bias), 4.0 * n),
            "layer_norm_fwd_bwd": (lambda: F.layer_norm(x2, (cols,), w, bias).backward(dy), 14.0 * n),
        }
        for name, (fn, nbytes) in cases.items():
            med, lo, hi = timed(torch, fn, args.warmup, args.reps)
            rows.append({"op": name, "operand_bytes": size, "bytes_moved": nbytes, "seconds": med,
                         "gbps": nbytes / med / 1e9, "fraction_of_bandwidth": nbytes / med / bandwidth})
        opt = torch.optim.AdamW([torch.nn.Parameter(p)], lr=1e-3, fused=True)
        opt.param_groups[0]["params"][0].grad = torch.randn_like(p)
        med, _, _ = timed(torch, opt.step, args.warmup, args.reps)
        nbytes = 28.0 * n  # f32 param, grad, m, v read (16), param, m, v written (12)
        rows.append({"op": "adamw_update", "operand_bytes": 4 * n, "bytes_moved": nbytes, "seconds": med,
                     "gbps": nbytes / med / 1e9, "fraction_of_bandwidth": nbytes / med / bandwidth})
        del x, y, x2, p, opt
    return rows


def launch_rows(torch, args):
    x = torch.zeros(1, device="cuda")
    med, _, _ = timed(torch, lambda: x.add_(1), args.warmup, args.reps)
    torch.cuda.synchronize()
    n = 10000
    t0 = time.perf_counter()
    for _ in range(n):
        x.add_(1)
    host = (time.perf_counter() - t0) / n
    torch.cuda.synchronize()
    return [{"op": "empty_kernel", "device_seconds": med},
            {"op": "launch_loop", "host_seconds_per_launch": host, "launches": n,
             "note": "PyTorch eager's dispatch plus cudaLaunchKernel; shardkit's C++ dispatcher is cheaper"}]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="kernel_sweep.json")
    ap.add_argument("--quick", action="store_true", help="fewer shapes (about a minute on an H100)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--peak_bf16_tflops", type=float, default=None,
                    help="dense bf16 datasheet peak (default: by device name: A100 312, H100/H200 989)")
    ap.add_argument("--bandwidth_gbps", type=float, default=None,
                    help="datasheet memory bandwidth (default by name: A100-80G 2039, H100 3350, H200 4800)")
    args = ap.parse_args()
    import torch
    if not torch.cuda.is_available():
        print("kernel_sweep: no CUDA device", file=sys.stderr)
        return 1
    name = torch.cuda.get_device_name()
    by_name = [("H200", 989.0, 67.0, 4800.0), ("H100", 989.0, 67.0, 3350.0), ("A100", 312.0, 19.5, 2039.0)]
    bf16, f32, bw = next(((b, f, w) for key, b, f, w in by_name if key in name), (None, None, None))
    bf16 = args.peak_bf16_tflops or bf16
    bw = args.bandwidth_gbps or bw
    if bf16 is None or bw is None:
        print("kernel_sweep: unknown device %r: give --peak_bf16_tflops and --bandwidth_gbps" % name, file=sys.stderr)
        return 1
    peaks = {"bf16": bf16 * 1e12, "f16": bf16 * 1e12, "f32": (f32 or bf16 / 16) * 1e12}
    torch.backends.cuda.matmul.allow_tf32 = False
    started = time.time()
    doc = {
        "tool": "tools/gpu/kernel_sweep.py",
        "device": {"name": name, "capability": list(torch.cuda.get_device_capability()),
                   "memory_bytes": torch.cuda.get_device_properties(0).total_memory,
                   "sm_count": torch.cuda.get_device_properties(0).multi_processor_count,
                   "torch": torch.__version__, "cuda": torch.version.cuda,
                   "cudnn": torch.backends.cudnn.version(),
                   "peak_tflops": {k: v / 1e12 for k, v in peaks.items()}, "bandwidth_gbps": bw},
        "settings": {"quick": args.quick, "warmup": args.warmup, "reps": args.reps,
                     "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
    }
    doc["launch"] = launch_rows(torch, args)
    doc["gemm"] = gemm_rows(torch, args, peaks)
    doc["attention"] = attention_rows(torch, args, peaks["bf16"])
    doc["memory"] = memory_rows(torch, args, bw * 1e9)
    doc["settings"]["wall_seconds"] = round(time.time() - started, 1)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print("kernel_sweep: %d GEMMs, %d attention shapes, %d memory rows in %.0f s -> %s" %
          (len(doc["gemm"]), len(doc["attention"]), len(doc["memory"]), doc["settings"]["wall_seconds"], args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

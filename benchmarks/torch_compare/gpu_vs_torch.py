#!/usr/bin/env python3
"""shardkit against PyTorch FSDP2 on one GPU: the same GPT training step, side by side, in one call.

OPTIONAL tool (README.md beside this file): it needs a Python with PyTorch
(the lent GPU machines have one) and is never a build or test dependency of
shardkit. On a GPU machine it runs from the GPU package
(`gpu-pkg/gpu_vs_torch.sh`, docs/cuda.md); here, on CPU, with a venv of your
own and a CPU build of the library:

    ./bazelw build -c opt //capi:libshardkit.so
    /tmp/torchvenv/bin/python benchmarks/torch_compare/gpu_vs_torch.py --device cpu --models gpt-tiny

Three sides, each at world 1 (one process, one device), per model:

    shardkit  FULL_SHARD, bf16 parameters / f32 reduction (the C ABI through
              ctypes: a `local` group of one rank and an sk_trainer on
              SK_DEVICE_CUDA, the path every frontend takes)
    eager     PyTorch FSDP2: fully_shard on every block, then the root,
              MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=f32), nccl
              (gloo on --device cpu), attention through
              F.scaled_dot_product_attention(is_causal=True)
    compiled  the same with every block under torch.compile (compiled before
              fully_shard, the FSDP2 recipe)

Both sides train the same GPT (torch_gpt.py: shardkit's runtime/nn/gpt.cc;
the parameter counts are compared at run time and a mismatch stops the run
before anything is timed) on the same batch and sequence length with AdamW
(lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01, no clipping).

Each side of each model runs in a process of its own (a hung or crashed one
is killed after --timeout and recorded; PyTorch and shardkit never share a
process or the GPU's memory); repetitions are interleaved: every model's
shardkit, eager, compiled, then again. A run does --warmup untimed steps
(the compiled side's first includes compilation, reported as compile_s),
then its timed steps, each timed by the caller's wall clock to the end of
the step (shardkit's step returns when done; PyTorch's is followed by
torch.cuda.synchronize()). Per side: the median over every timed step of
every repetition, min..max of the same steps, MFU = model FLOPs per step
(torch_gpt.model_flops, GptModel::Flops's formula, the same for both sides)
/ median step / the card's dense bf16 peak, and the peak memory during the
timed steps (shardkit: sk_step_metrics.peak_allocated_bytes; PyTorch:
torch.cuda.max_memory_allocated after a reset at the end of warm-up).

Writes gpu_vs_torch.json and gpu_vs_torch.md into --out (default $OUT, the
device tool's returned folder, else the current directory).
"""

import argparse
import ctypes
import datetime
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from torch_gpt import MODELS, model_flops, num_parameters

SIDES = ("shardkit", "eager", "compiled")
# Each side's key in a row of the JSON.
ROW_KEYS = {"shardkit": "shardkit", "eager": "torch_eager", "compiled": "torch_compiled"}
LR, BETAS, EPS, WEIGHT_DECAY = 1e-3, (0.9, 0.999), 1e-8, 0.01

# Dense bf16 tensor-core peaks from the datasheets (TFLOP/s), matched against
# the device name in this order. gpu_train uses the H100 SXM's 989 for every
# card; the H200 has the same tensor cores.
PEAK_BF16_TFLOPS = (("H100 PCIe", 756.0), ("H100", 989.0), ("H200", 989.0), ("A100", 312.0))


# --------------------------------------------------------------------------
# Workers: one process per (side, model, repetition); the last stdout line
# "RESULT {json}" is the answer.
# --------------------------------------------------------------------------

def timed_steps(args, step, after_warmup):
    """--warmup untimed steps, then --steps timed ones (0: as many as fill
    --timed_seconds at the last warm-up step's pace, 5 to 50)."""
    warmup = []
    for _ in range(args.warmup):
        t0 = time.perf_counter()
        step()
        warmup.append(time.perf_counter() - t0)
    after_warmup()
    n = args.steps
    if n <= 0:
        pace = warmup[-1] if warmup else 1.0
        n = max(args.min_steps, min(50, int(args.timed_seconds / max(pace, 1e-6))))
    wall = []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        wall.append(time.perf_counter() - t0)
    return {"warmup_s": warmup, "wall_s": wall}


def shardkit_worker(args):
    from sk_abi import (SK_DEVICE_CPU, SK_DEVICE_CUDA, SK_PARALLELISM_FSDP, SkDeviceOptions,
                        SkTrainerOptions, adamw_options, fsdp_options, load_shardkit,
                        new_step_metrics, sk_check)
    t_start = time.perf_counter()
    lib = load_shardkit(args.lib)
    groups = (ctypes.c_void_p * 1)()
    sk_check(lib, lib.sk_process_group_create_local(1, None, groups),
             "sk_process_group_create_local")
    device = SkDeviceOptions(ctypes.sizeof(SkDeviceOptions),
                             SK_DEVICE_CUDA if args.device == "cuda" else SK_DEVICE_CPU,
                             1, 0, None, 0, 0, 0)
    fsdp = fsdp_options(args.dtype)
    opt = adamw_options(LR, BETAS, EPS, WEIGHT_DECAY)
    o = SkTrainerOptions()
    o.struct_size = ctypes.sizeof(SkTrainerOptions)
    o.model = args.model.encode()
    o.fsdp = ctypes.pointer(fsdp)
    o.optimizer = ctypes.pointer(opt)
    o.batch_size = args.batch
    o.seq_len = args.seq
    o.data_seed = 1
    o.parallelism = SK_PARALLELISM_FSDP
    o.device = ctypes.pointer(device)
    trainer = ctypes.c_void_p()
    sk_check(lib, lib.sk_trainer_create(ctypes.byref(o), groups[0], ctypes.byref(trainer)),
             "sk_trainer_create")
    count = ctypes.c_int64()
    sk_check(lib, lib.sk_trainer_num_parameters(trainer, ctypes.byref(count)),
             "sk_trainer_num_parameters")
    startup = time.perf_counter() - t_start
    metrics = new_step_metrics()
    timed = {"on": False}
    peaks = {"alloc": 0, "reserved": 0}
    losses, sk_seconds, flops = [], [], []

    def step():
        sk_check(lib, lib.sk_trainer_step(trainer, ctypes.byref(metrics)), "sk_trainer_step")
        losses.append(float(metrics.loss))
        if timed["on"]:
            peaks["alloc"] = max(peaks["alloc"], metrics.peak_allocated_bytes)
            peaks["reserved"] = max(peaks["reserved"], metrics.peak_reserved_bytes)
            sk_seconds.append(metrics.step_seconds)
            flops.append(metrics.model_tflops_per_rank * metrics.step_seconds * 1e12)

    result = timed_steps(args, step, lambda: timed.update(on=True))
    lib.sk_trainer_destroy(trainer)
    lib.sk_process_group_destroy(groups[0])
    result.update(parameters=count.value, startup_s=startup, losses=losses,
                  peak_allocated_bytes=peaks["alloc"], peak_reserved_bytes=peaks["reserved"],
                  shardkit_step_seconds=sk_seconds,
                  shardkit_model_flops=statistics.median(flops) if flops else None)
    return result


def torch_worker(args):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from torch_gpt import build_gpt

    t_start = time.perf_counter()
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(0)
    store_dir = tempfile.mkdtemp(prefix="sk_gpu_vs_torch_store_")
    dist.init_process_group("nccl" if cuda else "gloo",
                            store=dist.FileStore(os.path.join(store_dir, "store"), 1),
                            rank=0, world_size=1)
    mesh = init_device_mesh(args.device, (1,))
    torch.manual_seed(1234)
    model = build_gpt(args.model, device="meta")
    parameters = sum(p.numel() for p in model.parameters())
    if args.side == "compiled":
        # Each block compiled before it is sharded (torchtitan's order): FSDP2's
        # hooks stay outside the compiled graphs; the identical blocks share
        # one compiled graph (parameters are graph inputs).
        for i, blk in enumerate(model.blocks):
            model.blocks[i] = torch.compile(blk)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if args.dtype == "bf16" else torch.float32,
                              reduce_dtype=torch.float32)
    for blk in model.blocks:
        fully_shard(blk, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    model.to_empty(device=args.device)
    model.init_weights()

    def adamw(kind):
        return torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS,
                                 weight_decay=WEIGHT_DECAY, **{kind: True})

    optimizer = {"kind": args.torch_adamw, "opt": adamw(args.torch_adamw), "note": None}
    vocab = MODELS[args.model][0]
    gen = torch.Generator(device=args.device).manual_seed(1)
    losses = []
    startup = time.perf_counter() - t_start

    def step():
        tokens = torch.randint(0, vocab, (args.batch, args.seq + 1), device=args.device,
                               generator=gen)
        optimizer["opt"].zero_grad(set_to_none=True)
        loss = model(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        try:
            optimizer["opt"].step()
        except Exception as e:  # fused AdamW over DTensors is newer than foreach
            if optimizer["kind"] != "fused" or optimizer["note"]:
                raise
            optimizer.update(kind="foreach", opt=adamw("foreach"),
                             note="fused AdamW failed (%s: %s), foreach used" % (type(e).__name__, e))
            optimizer["opt"].step()
        losses.append(loss.detach())
        if cuda:
            torch.cuda.synchronize()

    def reset_peak():
        if cuda:
            torch.cuda.reset_peak_memory_stats()

    result = timed_steps(args, step, reset_peak)
    if args.side == "compiled":
        # One graph for all blocks (and its backward) is the expected count;
        # one per block would mean recompilation (and past dynamo's cache
        # limit, blocks silently left eager).
        from torch._dynamo.utils import counters
        result["compile_stats"] = {"unique_graphs": counters["stats"]["unique_graphs"],
                                   "graph_breaks": sum(counters["graph_break"].values())}
    result.update(parameters=parameters, startup_s=startup, torch_adamw=optimizer["kind"],
                  torch_adamw_note=optimizer["note"],
                  losses=[float(l) for l in losses],
                  peak_allocated_bytes=torch.cuda.max_memory_allocated() if cuda else None,
                  peak_reserved_bytes=torch.cuda.max_memory_reserved() if cuda else None)
    dist.destroy_process_group()
    shutil.rmtree(store_dir, ignore_errors=True)
    return result


def sk_info_worker(args):
    from sk_abi import load_shardkit, sk_check
    lib = load_shardkit(args.lib)
    counts = {}
    for m in args.models.split(","):
        c = ctypes.c_int64()
        sk_check(lib, lib.sk_model_num_parameters(m.encode(), ctypes.byref(c)),
                 "sk_model_num_parameters(%s)" % m)
        counts[m] = c.value
    return {"version": lib.sk_version().decode(), "parameters": counts}


def torch_info_worker(args):
    import torch

    from torch_gpt import build_gpt
    counts = {m: sum(p.numel() for p in build_gpt(m, device="meta").parameters())
              for m in args.models.split(",")}
    info = {"torch": torch.__version__, "torch_cuda": torch.version.cuda, "parameters": counts}
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("--device cuda, but torch.cuda.is_available() is false")
        props = torch.cuda.get_device_properties(0)
        info.update(device_name=props.name, device_memory_bytes=props.total_memory,
                    capability="%d.%d" % (props.major, props.minor))
    else:
        info.update(device_name="cpu: " + platform_cpu())
    return info


WORKERS = {"shardkit": shardkit_worker, "eager": torch_worker, "compiled": torch_worker,
           "sk-info": sk_info_worker, "torch-info": torch_info_worker}


# --------------------------------------------------------------------------
# Driver (plain Python: it imports neither torch nor the library)
# --------------------------------------------------------------------------

def run_worker(args, side, timeout, model=None, steps=None):
    """Runs one worker process (`steps` timed steps, default --steps);
    returns (result dict or None, error or None, seconds). Killed with its
    process group after `timeout` seconds."""
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", side, "--device", args.device,
           "--dtype", args.dtype, "--batch", str(args.batch), "--warmup", str(args.warmup),
           "--steps", str(steps or args.steps), "--timed_seconds", str(args.timed_seconds),
           "--min_steps", str(args.min_steps), "--torch_adamw", args.torch_adamw,
           "--lib", args.lib, "--models", args.models]
    if model is not None:
        cmd += ["--model", model, "--seq", str(args.seq or MODELS[model][1])]
    env = dict(os.environ)
    if side in ("shardkit", "sk-info") and args.sk_ld_library_path:
        env["LD_LIBRARY_PATH"] = args.sk_ld_library_path
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return None, "timed out after %.0f s; stderr tail: %s" % (timeout, tail(err)), \
            time.monotonic() - t0
    seconds = time.monotonic() - t0
    lines = [l for l in out.splitlines() if l.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        return None, "exit %d: %s" % (p.returncode, tail(err)), seconds
    return json.loads(lines[-1][len("RESULT "):]), None, seconds


def tail(text, n=1500):
    text = (text or "").strip()
    return text if len(text) <= n else "..." + text[-n:]


def platform_cpu():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def nvidia_smi(field):
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=" + field, "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30)
        return r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def nvcc_version():
    for nvcc in ("nvcc", "/usr/local/cuda/bin/nvcc"):
        try:
            r = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if r.returncode == 0:
            return r.stdout.strip().splitlines()[-1]
    return None


def commit_of(manifest):
    """The package MANIFEST's commit line, else this checkout's HEAD."""
    if manifest and os.path.exists(manifest):
        with open(manifest) as f:
            for line in f:
                if line.startswith("commit:"):
                    return line.split(":", 1)[1].strip()
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        r = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True,
                           text=True, timeout=30)
        if r.returncode == 0:
            dirty = subprocess.run(["git", "-C", here, "diff", "--quiet", "HEAD"]).returncode
            return r.stdout.strip() + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.TimeoutExpired):
        pass
    return "unknown"


def peak_tflops(args, device_name):
    if args.peak_tflops > 0:
        return args.peak_tflops, "--peak_tflops"
    if args.device != "cuda":
        return None, "no peak for a CPU (MFU not reported)"
    for key, tflops in PEAK_BF16_TFLOPS:
        if key in (device_name or ""):
            return tflops, "datasheet dense bf16 of %s" % key
    return None, "unknown card %r: pass --peak_tflops" % device_name


def summarize(runs, flops, peak):
    """One side's runs (over repetitions) -> its figures."""
    ok = [r for r in runs if r.get("result")]
    errors = [r["error"] for r in runs if r.get("error")]
    s = {"error": "; ".join(errors) or None, "repetitions": len(ok)}
    if not ok:
        return s
    steps = [t for r in ok for t in r["result"]["wall_s"]]
    med = statistics.median(steps)
    peaks = [r["result"]["peak_allocated_bytes"] for r in ok]
    reserved = [r["result"]["peak_reserved_bytes"] for r in ok]
    s.update(
        step_s=med, step_min_s=min(steps), step_max_s=max(steps), timed_steps=len(steps),
        rep_median_s=[statistics.median(r["result"]["wall_s"]) for r in ok],
        mfu=flops / med / (peak * 1e12) if peak else None,
        tflops=flops / med / 1e12,
        peak_allocated_bytes=max(peaks) if None not in peaks else None,
        peak_reserved_bytes=max(reserved) if None not in reserved else None,
        first_loss=ok[0]["result"]["losses"][0],
        last_loss=ok[-1]["result"]["losses"][-1],
        startup_s=[round(r["result"]["startup_s"], 2) for r in ok],
        first_warmup_step_s=[round(r["result"]["warmup_s"][0], 3) for r in ok if r["result"]["warmup_s"]],
        process_s=[round(r["seconds"], 1) for r in ok])
    first = ok[0]["result"]
    if "compile_stats" in first:
        s["compile_stats"] = [r["result"]["compile_stats"] for r in ok]
    if "torch_adamw" in first:
        s["torch_adamw"] = first["torch_adamw"]
        s["torch_adamw_note"] = first["torch_adamw_note"]
    if "shardkit_step_seconds" in first:
        s["shardkit_timer_step_s"] = statistics.median(
            t for r in ok for t in r["result"]["shardkit_step_seconds"])
        s["shardkit_model_flops"] = ok[0]["result"]["shardkit_model_flops"]
    return s


def gib(b):
    return "-" if b is None else "%.2f" % (b / 2.0 ** 30)


def ms_cell(s):
    if s.get("step_s") is None:
        return "failed" if s.get("error") else "-"
    return "%.1f (%.1f..%.1f)" % (1e3 * s["step_s"], 1e3 * s["step_min_s"], 1e3 * s["step_max_s"])


def write_markdown(path, doc):
    env = doc["environment"]
    lines = [
        "# shardkit vs PyTorch FSDP2 on one GPU (gpu_vs_torch.py)" if doc["settings"]["device"] == "cuda"
        else "# shardkit vs PyTorch FSDP2 on CPU (gpu_vs_torch.py --device cpu: a check of the tool, not a benchmark)",
        "",
        "; ".join(part % value for part, value in (
            ("%s", env["device_name"]), ("driver %s", env["driver"]), ("CUDA %s (PyTorch's)", env["cuda"]),
            ("%s", env["nvcc"]), ("PyTorch %s", env["torch"]), ("shardkit %s", env["shardkit"]),
            ("commit %s", env["commit"]), ("%s", env["date"])) if value) + ".",
        "",
        "World 1, %s. Same GPT, batch and sequence on both sides; AdamW lr %g, betas %s, eps %g, "
        "weight decay %g (PyTorch: `%s`). %d interleaved repetitions (shardkit, eager, compiled per "
        "model), each a fresh process: %d warm-up steps, then %s timed steps (later repetitions "
        "as many as the first). Step = median over "
        "every timed step (min..max of the same steps), ms. MFU = model FLOPs / step / %s TFLOP/s "
        "(%s); model FLOPs per step = 3 x forward matmul FLOPs = 6 x matmul parameters x tokens "
        "+ 12 x layers x seq x d_model x tokens (GptModel::Flops). Peak = allocated bytes at the "
        "peak of the timed steps (shardkit: sk_step_metrics.peak_allocated_bytes; PyTorch: "
        "torch.cuda.max_memory_allocated), GiB."
        % (doc["settings"]["mode"], LR, BETAS, EPS, WEIGHT_DECAY, doc["settings"]["torch_adamw"],
           doc["settings"]["reps"], doc["settings"]["warmup"],
           doc["settings"]["steps"] or "auto (%.1f s at the warm-up pace, %d..50)"
           % (doc["settings"]["timed_seconds"], doc["settings"]["min_steps"]),
           doc["peak_tflops"] or "-", doc["peak_source"]),
        "",
        "| model (parameters) | batch x seq | shardkit | PyTorch eager | PyTorch compiled "
        "| MFU sk / eager / compiled | peak GiB sk / eager / compiled | sk / eager | sk / compiled |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def pct(x):
        return "-" if x is None else "%.1f%%" % (100 * x)

    def ratio(a, b):
        return "-" if a is None or b is None else "%.2f" % (a / b)

    for row in doc["rows"]:
        sk, ea, co = row["shardkit"], row["torch_eager"], row["torch_compiled"]
        lines.append("| %s (%s) | %d x %d | %s | %s | %s | %s / %s / %s | %s / %s / %s | %s | %s |" % (
            row["model"], "{:,}".format(row["parameters"]), row["batch"], row["seq"],
            ms_cell(sk), ms_cell(ea), ms_cell(co), pct(sk.get("mfu")), pct(ea.get("mfu")),
            pct(co.get("mfu")), gib(sk.get("peak_allocated_bytes")),
            gib(ea.get("peak_allocated_bytes")), gib(co.get("peak_allocated_bytes")),
            ratio(sk.get("step_s"), ea.get("step_s")), ratio(sk.get("step_s"), co.get("step_s"))))
    lines += ["", "First / last loss (both near ln(vocab) at the start), compile time, errors:", ""]
    for row in doc["rows"]:
        for title, key in ROW_KEYS.items():
            s = row[key]
            if s.get("step_s") is not None:
                extra = ""
                if key == "torch_compiled" and s.get("first_warmup_step_s"):
                    extra = ", first step (compilation) %s s, dynamo %s" % (
                        s["first_warmup_step_s"], s.get("compile_stats"))
                if s.get("torch_adamw"):
                    extra += ", AdamW %s%s" % (s["torch_adamw"], " (%s)" % s["torch_adamw_note"]
                                               if s.get("torch_adamw_note") else "")
                lines.append("- %s %s: loss %.4f -> %.4f, %d timed steps, startup %s s%s"
                             % (row["model"], title, s["first_loss"], s["last_loss"],
                                s["timed_steps"], s["startup_s"], extra))
            if s.get("error"):
                lines.append("- %s %s: **error**: %s" % (row["model"], title,
                                                         s["error"].replace("\n", " ")[:600]))
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="gpt-150m,gpt-1.3b",
                    help="comma-separated named configs (%s)" % ", ".join(MODELS))
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--dtype", choices=("bf16", "f32"), default="bf16",
                    help="parameter (compute) dtype; gradients are reduced in f32 either way")
    ap.add_argument("--batch", type=int, default=8, help="sequences per step (gpu_train's 8)")
    ap.add_argument("--seq", type=int, default=0, help="0 = the model's sequence length")
    ap.add_argument("--reps", type=int, default=2, help="interleaved repetitions")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps per run (>= 1)")
    ap.add_argument("--steps", type=int, default=0,
                    help="timed steps per run; 0 = as many as fill --timed_seconds")
    ap.add_argument("--timed_seconds", type=float, default=2.5)
    ap.add_argument("--min_steps", type=int, default=5)
    ap.add_argument("--quick", action="store_true",
                    help="one repetition, 2 warm-up steps, about 1 s of timed steps")
    ap.add_argument("--sides", default=",".join(SIDES), help="subset of " + ",".join(SIDES))
    ap.add_argument("--torch_adamw", choices=("fused", "foreach"), default="fused",
                    help="PyTorch's AdamW implementation (torchtitan's default: fused)")
    ap.add_argument("--peak_tflops", type=float, default=0,
                    help="dense bf16 peak for MFU; 0 = from the device name")
    ap.add_argument("--timeout", type=float, default=150, help="seconds per worker process")
    ap.add_argument("--compile_timeout", type=float, default=300,
                    help="seconds for a compiled run that compiles (the first of each model)")
    ap.add_argument("--deadline", type=float, default=0,
                    help="seconds for the whole run; runs that would start later are skipped "
                         "and recorded (0 = none)")
    ap.add_argument("--lib", default="bazel-bin/capi/libshardkit.so")
    ap.add_argument("--sk_ld_library_path", default=os.environ.get("SK_SHARDKIT_LD_LIBRARY_PATH", ""),
                    help="LD_LIBRARY_PATH for the shardkit processes only (gpu_vs_torch.sh sets it)")
    ap.add_argument("--manifest", default="", help="the GPU package's MANIFEST (its commit line)")
    ap.add_argument("--out", default=os.environ.get("OUT") or ".",
                    help="directory for gpu_vs_torch.json and .md (default $OUT, else .)")
    ap.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        args.side = args.worker
        result = WORKERS[args.worker](args)
        print("RESULT " + json.dumps(result), flush=True)
        return 0

    if args.quick:
        args.reps, args.warmup, args.timed_seconds, args.min_steps = 1, 2, 1.0, 3
    models = [m for m in args.models.split(",") if m]
    sides = [s for s in args.sides.split(",") if s]
    for m in models:
        if m not in MODELS:
            sys.exit("--models: unknown %s (known: %s)" % (m, ", ".join(MODELS)))
        if args.seq > MODELS[m][1]:
            sys.exit("--seq %d is longer than %s's %d" % (args.seq, m, MODELS[m][1]))
    for s in sides:
        if s not in SIDES:
            sys.exit("--sides: unknown %s (known: %s)" % (s, ", ".join(SIDES)))
    if not models or not sides or args.reps < 1 or args.warmup < 1 or args.batch < 1 or args.seq < 0:
        sys.exit("need --models, --sides, --reps >= 1, --warmup >= 1, --batch >= 1, --seq >= 0")
    args.models = ",".join(models)
    if not os.path.exists(args.lib):
        sys.exit("%s not found: ./bazelw build -c opt //capi:libshardkit.so" % args.lib)
    real = os.path.realpath(args.lib)
    if "fastbuild" in real or "-dbg" in real:
        sys.exit("%s is not an optimised build (%s): ./bazelw build -c opt //capi:libshardkit.so"
                 % (args.lib, real))
    # bazel-bin follows the last build's configuration: use a private copy.
    args.lib = shutil.copy2(real, os.path.join(tempfile.mkdtemp(prefix="sk_gpu_vs_torch_"),
                                               "libshardkit.so"))
    os.makedirs(args.out, exist_ok=True)
    t_begin = time.monotonic()

    # Versions and both sides' parameter counts, before anything is timed.
    # Versions and both sides' parameter counts, before anything is timed. A
    # side that cannot even start is recorded as failed and the other runs.
    sk_info, sk_err, _ = run_worker(args, "sk-info", args.timeout)
    torch_info, torch_err, _ = run_worker(args, "torch-info", args.timeout)
    failed = {}  # (model, side) -> error; such a side is not run (again)
    for m in models:
        for s in sides:
            err = sk_err if s == "shardkit" else torch_err
            if err:
                failed[(m, s)] = ("shardkit's library does not load: " if s == "shardkit" else
                                  "PyTorch is not usable here: ") + err
    if sk_err and torch_err:
        sys.exit("gpu_vs_torch: neither side starts:\nshardkit: %s\ntorch: %s" % (sk_err, torch_err))
    mismatch = []
    for m in models:
        counts = {"table": num_parameters(m)}
        if sk_info:
            counts["shardkit"] = sk_info["parameters"][m]
        if torch_info:
            counts["PyTorch"] = torch_info["parameters"][m]
        if len(set(counts.values())) != 1:
            mismatch.append(m)
        print("%s parameters: %s%s" % (m, ", ".join("%s %d" % kv for kv in counts.items()),
                                       "  <-- MISMATCH" if m in mismatch else ""), flush=True)
    if mismatch:
        sys.exit("gpu_vs_torch: PARAMETER COUNTS DIFFER for %s: torch_gpt.py no longer builds "
                 "shardkit's model (runtime/nn/configs.cc); nothing was timed" % ", ".join(mismatch))
    torch_info = torch_info or {}
    sk_info = sk_info or {}
    env = {
        "device_name": torch_info.get("device_name") or (
            nvidia_smi("name") if args.device == "cuda" else "cpu: " + platform_cpu()),
        "device_memory_bytes": torch_info.get("device_memory_bytes"),
        "driver": nvidia_smi("driver_version") if args.device == "cuda" else None,
        "cuda": torch_info.get("torch_cuda") if args.device == "cuda" else None,
        "torch_cuda": torch_info.get("torch_cuda"),
        "nvcc": nvcc_version() if args.device == "cuda" else None,
        "torch": torch_info.get("torch"),
        "shardkit": sk_info.get("version"),
        "commit": commit_of(args.manifest),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": platform.node(),
        "cpu": platform_cpu(),
        "cores": os.cpu_count(),
    }
    peak, peak_source = peak_tflops(args, env["device_name"])
    print("device: %s; torch %s; shardkit %s; peak %s TFLOP/s (%s)"
          % (env["device_name"], env["torch"], env["shardkit"], peak, peak_source), flush=True)

    runs = {(m, s): [] for m in models for s in sides}
    for key, err in failed.items():
        runs[key].append({"error": err})
    for rep in range(args.reps):
        for m in models:
            for s in sides:
                if (m, s) in failed:
                    continue
                timeout = args.timeout
                if s == "compiled" and not any(r.get("result") for r in runs[(m, s)]):
                    timeout = args.compile_timeout
                if args.deadline > 0:
                    left = args.deadline - (time.monotonic() - t_begin)
                    if left < 10:
                        failed[(m, s)] = "skipped: past --deadline %.0f s" % args.deadline
                        runs[(m, s)].append({"error": failed[(m, s)]})
                        continue
                    timeout = min(timeout, left)
                # Later repetitions time as many steps as the first did, so
                # that each weighs the same in the median.
                first = next((r["result"] for r in runs[(m, s)] if r.get("result")), None)
                steps = len(first["wall_s"]) if first else None
                result, err, seconds = run_worker(args, s, timeout, model=m, steps=steps)
                runs[(m, s)].append({"result": result, "error": err, "seconds": seconds})
                if err:
                    failed[(m, s)] = err
                    print("rep %d %-9s %-8s FAILED after %.0f s: %s"
                          % (rep + 1, m, s, seconds, err.splitlines()[-1] if err else ""), flush=True)
                else:
                    w = result["wall_s"]
                    print("rep %d %-9s %-8s median %8.2f ms over %2d steps (warm-up %s s), "
                          "peak %s GiB, loss %.3f, %.0f s" % (
                              rep + 1, m, s, 1e3 * statistics.median(w), len(w),
                              ", ".join("%.2f" % x for x in result["warmup_s"]),
                              gib(result["peak_allocated_bytes"]), result["losses"][-1], seconds),
                          flush=True)

    rows = []
    for m in models:
        seq = args.seq or MODELS[m][1]
        flops = model_flops(m, args.batch, seq)
        row = {"model": m, "mode": "FULL_SHARD, %s params / f32 reduce" % args.dtype,
               "batch": args.batch, "seq": seq, "parameters": num_parameters(m),
               "model_flops_per_step": flops}
        for s in SIDES:
            row[ROW_KEYS[s]] = summarize(runs.get((m, s), []), flops, peak)
        sk_flops = row["shardkit"].get("shardkit_model_flops")
        if sk_flops and abs(sk_flops / flops - 1) > 0.01:
            print("WARNING: %s: shardkit counts %.4g model FLOPs per step, torch_gpt.model_flops "
                  "%.4g: MFU below uses the latter for both" % (m, sk_flops, flops), flush=True)
        for key in ("shardkit", "torch_eager", "torch_compiled"):
            row[key + "_step_s"] = row[key].get("step_s")
            row[key + "_mfu"] = row[key].get("mfu")
            row[key + "_peak_allocated_bytes"] = row[key].get("peak_allocated_bytes")
        for key in ("torch_eager", "torch_compiled"):
            a, b = row["shardkit"].get("step_s"), row[key].get("step_s")
            row["shardkit_over_" + key] = a / b if a and b else None
        rows.append(row)

    doc = {"tool": "benchmarks/torch_compare/gpu_vs_torch.py", "environment": env,
           "peak_tflops": peak, "peak_source": peak_source,
           "flops_formula": "3 * (layers * (2*N*C*4C + 4*N*T*C + 2*N*C*4C*2) + 2*N*C*V), "
                            "N = batch * seq tokens (GptModel::Flops)",
           "settings": {"device": args.device, "dtype": args.dtype, "mode": rows[0]["mode"],
                        "reps": args.reps, "warmup": args.warmup, "steps": args.steps,
                        "timed_seconds": args.timed_seconds, "min_steps": args.min_steps,
                        "torch_adamw": args.torch_adamw, "sides": sides,
                        "adamw": {"lr": LR, "betas": BETAS, "eps": EPS,
                                  "weight_decay": WEIGHT_DECAY},
                        "wall_seconds": round(time.monotonic() - t_begin, 1)},
           "rows": rows}
    with open(os.path.join(args.out, "gpu_vs_torch.json"), "w") as f:
        json.dump(doc, f, indent=1)
    table = write_markdown(os.path.join(args.out, "gpu_vs_torch.md"), doc)
    print("\n" + table)
    print("\nwrote %s and gpu_vs_torch.md (%.0f s in all)"
          % (os.path.join(args.out, "gpu_vs_torch.json"), time.monotonic() - t_begin))
    # Exit status 0 when every side asked for produced a step time.
    return 0 if all(row[ROW_KEYS[s]].get("step_s") is not None for row in rows for s in sides) else 1


if __name__ == "__main__":
    sys.exit(main())

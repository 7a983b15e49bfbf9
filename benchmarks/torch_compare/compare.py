#!/usr/bin/env python3
"""shardkit against PyTorch on CPU: the same GPT training step, side by side.

OPTIONAL tool (README.md beside this file). It needs PyTorch from PyPI in a
virtual environment of your own and is never a build or test dependency of
shardkit: no Bazel target runs it, nothing imports it.

    python3 -m venv /tmp/torchvenv && /tmp/torchvenv/bin/pip install torch numpy
    ./bazelw build -c opt //capi:libshardkit.so
    /tmp/torchvenv/bin/python benchmarks/torch_compare/compare.py

Each configuration is `world` processes (ranks), one compute thread each
(torch.set_num_threads(1); shardkit's trainer is told that the machine's
cores are shared, so it takes one GEMM thread per rank), gloo over loopback
TCP on both sides, AdamW in f32, the same GPT (pre-LN, tanh GELU, biases,
untied LM head without bias: shardkit's runtime/nn/gpt.cc) and the same
per-rank batch and sequence:

    shardkit  DDP         (C ABI through ctypes: sk_trainer over a gloo group)
    shardkit  FULL_SHARD
    torch     DDP         (DistributedDataParallel)
    torch     FSDP1       (FullyShardedDataParallel, FULL_SHARD, one unit per block)
    torch     FSDP2       (fully_shard per block, then the root)

Repetitions are interleaved (every configuration once, then again), each run
does `--warmup` untimed steps and `--steps` timed ones. Per run: the step time
is the median over timed steps of the slowest rank's wall time; CPU time is
the median over timed steps of each rank's process CPU time (all of its
threads), averaged over ranks. The table gives the median over repetitions,
the spread (min-max over repetitions) and shardkit / PyTorch ratios. Load
averages before and after each run are printed: on a shared machine, prefer
the CPU-time columns.
"""

import argparse
import ctypes
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from sk_abi import (SK_PARALLELISM_DDP, SK_PARALLELISM_FSDP, SkGlooOptions, SkTrainerOptions,
                    adamw_options, fsdp_options, load_shardkit, new_step_metrics, sk_check)
from torch_gpt import MODELS, build_gpt

CONFIGS = [
    ("shardkit", "DDP"),
    ("shardkit", "FULL_SHARD"),
    ("torch", "DDP"),
    ("torch", "FSDP1"),
    ("torch", "FSDP2"),
]

LR, BETAS, EPS, WEIGHT_DECAY = 1e-3, (0.9, 0.999), 1e-8, 0.01


# --------------------------------------------------------------------------
# shardkit through the C ABI (sk_abi.py beside this file)
# --------------------------------------------------------------------------

def shardkit_worker(args, rank, world, port):
    lib = load_shardkit(args.lib)
    count = ctypes.c_int64()
    sk_check(lib, lib.sk_model_num_parameters(args.model.encode(), ctypes.byref(count)),
             "sk_model_num_parameters")
    gloo = SkGlooOptions(ctypes.sizeof(SkGlooOptions), rank, world, b"127.0.0.1", port,
                         None, 600000, 0, None)
    group = ctypes.c_void_p()
    sk_check(lib, lib.sk_process_group_create_gloo(ctypes.byref(gloo), ctypes.byref(group)),
             "sk_process_group_create_gloo")
    # Compute precision: bf16 gathers and computes in bf16 (f32 master
    # weights, optimizer and gradient reduction as in f32). --forward_prefetch:
    # the next unit's all-gather issued before this one's forward (PyTorch's
    # FSDP1 forward_prefetch; FSDP2's set_modules_to_forward_prefetch). Off by
    # default on both sides.
    fsdp = fsdp_options(args.dtype, args.forward_prefetch)
    opt = adamw_options(LR, BETAS, EPS, WEIGHT_DECAY)
    o = SkTrainerOptions()
    o.struct_size = ctypes.sizeof(SkTrainerOptions)
    o.model = args.model.encode()
    o.fsdp = ctypes.pointer(fsdp)
    o.optimizer = ctypes.pointer(opt)
    o.batch_size = args.batch
    o.seq_len = args.seq or 0
    o.data_seed = 1  # the same on every rank: the trainer gives each rank its own batches
    o.parallelism = SK_PARALLELISM_DDP if args.mode == "DDP" else SK_PARALLELISM_FSDP
    trainer = ctypes.c_void_p()
    sk_check(lib, lib.sk_trainer_create(ctypes.byref(o), group, ctypes.byref(trainer)),
             "sk_trainer_create")
    metrics = new_step_metrics()
    losses = []

    def step():
        sk_check(lib, lib.sk_trainer_step(trainer, ctypes.byref(metrics)), "sk_trainer_step")
        losses.append(float(metrics.loss))

    result = timed_steps(args, step)
    lib.sk_trainer_destroy(trainer)
    lib.sk_process_group_destroy(group)
    result.update(parameters=count.value, losses=losses)
    return result


# --------------------------------------------------------------------------
# PyTorch
# --------------------------------------------------------------------------

def torch_worker(args, rank, world, port):
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    torch.set_num_threads(1)
    torch.manual_seed(1234)  # the same initial model on every rank (DDP checks it)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port,
                            rank=rank, world_size=world)
    vocab, max_seq = MODELS[args.model][:2]
    seq = args.seq or max_seq
    model = build_gpt(args.model)
    parameters = sum(p.numel() for p in model.parameters())
    if args.mode == "DDP":
        model = nn.parallel.DistributedDataParallel(model)
    elif args.mode == "FSDP1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import ShardingStrategy
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        model = FSDP(model, sharding_strategy=ShardingStrategy.FULL_SHARD,
                     auto_wrap_policy=ModuleWrapPolicy({type(model.blocks[0])}), device_id=torch.device("cpu"),
                     forward_prefetch=args.forward_prefetch)
    elif args.mode == "FSDP2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (world,))
        for blk in model.blocks:
            fully_shard(blk, mesh=mesh)
        fully_shard(model, mesh=mesh)
        if args.forward_prefetch:  # each block gathers the next one (the FSDP2 tutorial's form)
            for cur, nxt in zip(model.blocks[:-1], model.blocks[1:]):
                cur.set_modules_to_forward_prefetch([nxt])
    else:
        raise ValueError("unknown torch mode " + args.mode)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS,
                            weight_decay=WEIGHT_DECAY)
    gen = torch.Generator().manual_seed(1 + rank)
    losses = []

    # bf16: CPU autocast (torch.autocast("cpu", torch.bfloat16)): matmuls and
    # attention in bf16 on f32 parameters, the optimizer in f32.
    autocast = lambda: torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.dtype == "bf16")

    def step():
        tokens = torch.randint(0, vocab, (args.batch, seq + 1), generator=gen)
        inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        opt.zero_grad(set_to_none=True)
        with autocast():
            loss = model(inputs, targets)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))

    result = timed_steps(args, step)
    dist.barrier()
    dist.destroy_process_group()
    result.update(parameters=parameters, losses=losses, torch_version=torch.__version__)
    return result


# --------------------------------------------------------------------------
# Worker and driver
# --------------------------------------------------------------------------

def timed_steps(args, step):
    for _ in range(args.warmup):
        step()
    wall, cpu = [], []
    for _ in range(args.steps):
        c0, t0 = time.process_time(), time.perf_counter()
        step()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return {"wall": wall, "cpu": cpu,
            "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}


def worker_main(args):
    rank, world, port = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["MASTER_PORT"])
    fn = shardkit_worker if args.framework == "shardkit" else torch_worker
    result = fn(args, rank, world, port)
    result["rank"] = rank
    print("RESULT " + json.dumps(result), flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_config(args, framework, mode, model, world):
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                   OPENBLAS_NUM_THREADS="1",
                   # shardkit's trainer takes cores / LOCAL_WORLD_SIZE GEMM threads
                   # per rank: the core count gives one, as torch.set_num_threads(1).
                   LOCAL_WORLD_SIZE=str(os.cpu_count() or 1))
        python = args.torch_python if framework == "torch" else sys.executable
        cmd = [python, os.path.abspath(__file__), "--worker", "--framework=" + framework,
               "--mode=" + mode, "--model=" + model, "--batch=%d" % args.batch,
               "--seq=%d" % args.seq, "--dtype=" + args.dtype, "--steps=%d" % args.steps, "--warmup=%d" % args.warmup,
               "--lib=" + args.lib] + (["--forward_prefetch"] if args.forward_prefetch else [])
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    results, errors = [], []
    for p in procs:
        out, err = p.communicate(timeout=args.timeout)
        lines = [l for l in out.splitlines() if l.startswith("RESULT ")]
        if p.returncode != 0 or not lines:
            errors.append("exit %d: %s" % (p.returncode, err.strip()[-2000:]))
        else:
            results.append(json.loads(lines[-1][len("RESULT "):]))
    if errors:
        raise RuntimeError("%s %s %s world %d failed:\n%s" % (framework, mode, model, world,
                                                              "\n".join(errors)))
    steps = len(results[0]["wall"])
    step_wall = statistics.median(max(r["wall"][i] for r in results) for i in range(steps))
    cpu = statistics.mean(statistics.median(r["cpu"]) for r in results)
    return {"wall": step_wall, "cpu": cpu, "rss": max(r["max_rss_mib"] for r in results),
            "parameters": results[0]["parameters"], "loss0": results[0]["losses"][0],
            "torch_version": results[0].get("torch_version")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="gpt-10m,gpt-deep-20m")
    ap.add_argument("--worlds", default="1,2")
    ap.add_argument("--configs", default=",".join(f + ":" + m for f, m in CONFIGS),
                    help="framework:mode list, e.g. shardkit:DDP,torch:FSDP2")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8, help="sequences per rank")
    ap.add_argument("--seq", type=int, default=0, help="0 = the model's sequence length")
    ap.add_argument("--dtype", choices=("f32", "bf16"), default="f32",
                    help="compute precision: bf16 = shardkit param_dtype bf16, "
                         "PyTorch CPU autocast to bf16 (both: f32 master weights and AdamW)")
    ap.add_argument("--forward_prefetch", action="store_true",
                    help="FULL_SHARD on both sides gathers the next unit before this one's "
                         "forward (shardkit forward_prefetch, FSDP1 forward_prefetch=True, FSDP2 "
                         "set_modules_to_forward_prefetch); default off, as both libraries default")
    ap.add_argument("--lib", default="bazel-bin/capi/libshardkit.so")
    ap.add_argument("--torch_python", default=sys.executable,
                    help="interpreter of the venv that has torch")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--json", default="", help="also write every run's figures here")
    # Worker mode (internal).
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--framework", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.lib = os.path.abspath(args.lib)
    if args.worker:
        return worker_main(args)

    models = [m for m in args.models.split(",") if m]
    for m in models:
        if m not in MODELS:
            sys.exit("unknown model %s (known: %s)" % (m, ", ".join(MODELS)))
    worlds = [w for w in args.worlds.split(",") if w]
    for w in worlds:
        if not w.isdigit() or not 1 <= int(w) <= 1024:
            sys.exit("--worlds: %r is not a world size from 1 to 1024" % w)
    worlds = [int(w) for w in worlds]
    configs = [tuple(c.split(":")) for c in args.configs.split(",") if c]
    for c in configs:
        if c not in CONFIGS:
            sys.exit("--configs: unknown %r (known: %s)"
                     % (":".join(c), ", ".join(f + ":" + m for f, m in CONFIGS)))
    for name in ("reps", "steps"):
        if getattr(args, name) < 1:
            sys.exit("--%s must be at least 1" % name)
    if args.warmup < 0 or args.batch < 1 or args.seq < 0:
        sys.exit("--warmup must be >= 0, --batch >= 1 and --seq >= 0")
    if not models or not worlds or not configs:
        sys.exit("--models, --worlds and --configs each need at least one entry")
    if not os.path.exists(args.lib):
        sys.exit("%s not found: ./bazelw build -c opt //capi:libshardkit.so" % args.lib)
    # bazel-bin follows the last build's configuration: a `bazel test` while
    # this runs would swap an unoptimised library in under the workers. Refuse
    # a non-opt build and load a private copy taken now.
    real = os.path.realpath(args.lib)
    if "fastbuild" in real or "-dbg" in real:
        sys.exit("%s is not an optimised build (%s): ./bazelw build -c opt //capi:libshardkit.so"
                 % (args.lib, real))
    copy_dir = tempfile.mkdtemp(prefix="sk_compare_")
    args.lib = shutil.copy2(real, os.path.join(copy_dir, "libshardkit.so"))
    print("shardkit library: %s (copied to %s)" % (real, args.lib))
    if any(f == "torch" for f, _ in configs):
        probe = subprocess.run([args.torch_python, "-c", "import torch; print(torch.__version__)"],
                               capture_output=True, text=True)
        if probe.returncode != 0:
            sys.exit("torch is not importable by %s (this tool is optional: install torch in a "
                     "venv and pass --torch_python)" % args.torch_python)
        print("torch", probe.stdout.strip())
    print("machine: %d cores; %s" % (os.cpu_count(), platform_cpu()))
    runs = {}  # (model, world, framework, mode) -> list of run dicts
    for rep in range(args.reps):
        for model in models:
            for world in worlds:
                for framework, mode in configs:
                    load0 = os.getloadavg()[0]
                    r = run_config(args, framework, mode, model, world)
                    r["load"] = (load0, os.getloadavg()[0])
                    runs.setdefault((model, world, framework, mode), []).append(r)
                    print("rep %d %-12s world %d %-8s %-10s step %7.1f ms wall, %7.1f ms CPU/rank, "
                          "rss %6.0f MiB, %d params, loss0 %.4f, load %.1f->%.1f" %
                          (rep + 1, model, world, framework, mode, 1e3 * r["wall"], 1e3 * r["cpu"],
                           r["rss"], r["parameters"], r["loss0"], r["load"][0], r["load"][1]),
                          flush=True)
    print_table(runs, models, worlds, configs, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{"model": k[0], "world": k[1], "framework": k[2], "mode": k[3], "runs": v}
                       for k, v in runs.items()], f, indent=1)


def platform_cpu():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def print_table(runs, models, worlds, configs, args):
    def med(key, k):
        return statistics.median(r[key] for r in runs[k])

    def spread(key, k):
        v = [r[key] for r in runs[k]]
        return "%.0f-%.0f" % (1e3 * min(v), 1e3 * max(v))

    pairs = {"DDP": ["DDP"], "FULL_SHARD": ["FSDP1", "FSDP2"]}
    print("\n%d interleaved repetitions x median of %d timed steps (after %d warm-up), batch %d "
          "per rank, %s compute%s; ms per step" % (args.reps, args.steps, args.warmup, args.batch,
                                                    args.dtype,
                                                    ", forward prefetch" if args.forward_prefetch else ""))
    print("| model (params sk / torch) | world | config | step ms (spread) | CPU ms/rank (spread) "
          "| peak RSS MiB | shardkit/torch step | shardkit/torch CPU |")
    print("|---|---|---|---|---|---|---|---|")
    for model in models:
        for world in worlds:
            for framework, mode in configs:
                k = (model, world, framework, mode)
                params = "%d / %s" % (
                    runs[k][0]["parameters"] if framework == "shardkit" else
                    next((runs[j][0]["parameters"] for j in runs if j[:3] == (model, world, "shardkit")), 0),
                    next((str(runs[j][0]["parameters"]) for j in runs if j[:3] == (model, world, "torch")), "-"))
                ratios_w, ratios_c = [], []
                if framework == "shardkit":
                    for tm in pairs.get(mode, []):
                        tk = (model, world, "torch", tm)
                        if tk in runs:
                            ratios_w.append("%.2f (vs %s)" % (med("wall", k) / med("wall", tk), tm))
                            ratios_c.append("%.2f (vs %s)" % (med("cpu", k) / med("cpu", tk), tm))
                print("| %s (%s) | %d | %s %s | %.0f (%s) | %.0f (%s) | %.0f | %s | %s |" % (
                    model, params, world, framework, mode, 1e3 * med("wall", k), spread("wall", k),
                    1e3 * med("cpu", k), spread("cpu", k), max(r["rss"] for r in runs[k]),
                    ", ".join(ratios_w) or "", ", ".join(ratios_c) or ""))
    loads = [x for v in runs.values() for r in v for x in r["load"]]
    print("\nload average (1 min) over the runs: %.1f-%.1f" % (min(loads), max(loads)))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""shardkit against PyTorch on CPU: the same Llama training step, side by side.

OPTIONAL tool, like compare.py beside it (README.md): it needs torch and
transformers in a virtual environment of your own, and nothing in the build or
the tests runs or imports it.

    ./bazelw build -c opt //capi:libshardkit.so
    /work/venv/bin/python benchmarks/torch_compare/llama_compare.py --out /tmp/llama_compare.json

Both sides train the model of one config.json (LlamaForCausalLM), which the
driver writes into a directory per model and both read: shardkit takes the
directory as its model name (docs/finetune.md: a Hugging Face directory's
config.json gives the shape), PyTorch builds transformers'
LlamaForCausalLM from it with attn_implementation="sdpa". World 2 over gloo
(loopback TCP), ranks as processes with one compute thread each
(torch.set_num_threads(1); shardkit's trainer takes cores / LOCAL_WORLD_SIZE
GEMM threads, LOCAL_WORLD_SIZE set to the core count: one), FULL_SHARD:

    shardkit  FULL_SHARD, param_dtype f32 or bf16, gradients reduced in f32
    torch     FSDP2: fully_shard on every decoder layer, then the root;
              bf16 = MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=f32)

AdamW in f32 on both (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01),
the same per-rank batch and sequence, the loss cross-entropy over every
position in f32 (PyTorch: the logits upcast to f32, as transformers' loss
does). Each run: --warmup untimed steps, then --steps timed ones; a rank's
CPU time per step is its process CPU time (all threads) over the step; the
table gives the median over timed steps averaged over the ranks, the whole
job's CPU-seconds per step (both ranks), the peak RSS (max over ranks,
ru_maxrss) and shardkit / PyTorch ratios. Each configuration runs shardkit,
then PyTorch, back to back; --reps=N repeats the whole sweep N times,
interleaved (every configuration and side once, then again), and the table
gives each side's median over repetitions (with --lib_before=<another
libshardkit.so>, e.g. main's, each row runs it first, then this one, then
PyTorch, and the table gives both ratios). The 1-minute load average before and after each
run is recorded: on a shared machine read the CPU-time columns.
"""

import argparse
import ctypes
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from compare import free_port, platform_cpu, timed_steps
from sk_abi import (SK_PARALLELISM_FSDP, SkGlooOptions, SkTrainerOptions, adamw_options,
                    fsdp_options, load_shardkit, new_step_metrics, sk_check)

LR, BETAS, EPS, WEIGHT_DECAY = 1e-3, (0.9, 0.999), 1e-8, 0.01

# config.json of each model. llama-10m is shardkit's named llama-10m
# (runtime/nn/configs.cc: vocabulary 1024, d_model 384, 6 layers, 6 heads,
# 2 kv heads, d_ff 1024); llama-100m a Llama of ~100M parameters (GPT-2
# small's width and depth, 4 kv heads, d_ff 2048, a 16384-token vocabulary).
MODELS = {
    "llama-10m": dict(vocab_size=1024, hidden_size=384, intermediate_size=1024,
                      num_hidden_layers=6, num_attention_heads=6, num_key_value_heads=2),
    "llama-100m": dict(vocab_size=16384, hidden_size=768, intermediate_size=2048,
                       num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=4),
}


def write_config(directory, model, max_positions):
    cfg = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_act="silu",
               max_position_embeddings=max_positions, rms_norm_eps=1e-5, rope_theta=10000.0,
               rope_scaling=None, tie_word_embeddings=False, attention_bias=False,
               mlp_bias=False, attention_dropout=0.0, torch_dtype="float32", **MODELS[model])
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)


def shardkit_worker(args, rank, world, port):
    lib = load_shardkit(args.lib)
    gloo = SkGlooOptions(ctypes.sizeof(SkGlooOptions), rank, world, b"127.0.0.1", port,
                         None, 600000, 0, None)
    group = ctypes.c_void_p()
    sk_check(lib, lib.sk_process_group_create_gloo(ctypes.byref(gloo), ctypes.byref(group)),
             "sk_process_group_create_gloo")
    fsdp = fsdp_options(args.dtype)
    opt = adamw_options(LR, BETAS, EPS, WEIGHT_DECAY)
    o = SkTrainerOptions()
    o.struct_size = ctypes.sizeof(SkTrainerOptions)
    o.model = args.model_dir.encode()
    o.fsdp = ctypes.pointer(fsdp)
    o.optimizer = ctypes.pointer(opt)
    o.batch_size = args.batch
    o.seq_len = args.seq
    o.data_seed = 1
    o.parallelism = SK_PARALLELISM_FSDP
    trainer = ctypes.c_void_p()
    sk_check(lib, lib.sk_trainer_create(ctypes.byref(o), group, ctypes.byref(trainer)),
             "sk_trainer_create")
    count = ctypes.c_int64()
    sk_check(lib, lib.sk_trainer_num_parameters(trainer, ctypes.byref(count)),
             "sk_trainer_num_parameters")
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


def torch_worker(args, rank, world, port):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    import transformers
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.set_num_threads(1)
    torch.manual_seed(1234)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % port, rank=rank,
                            world_size=world)
    config = AutoConfig.from_pretrained(args.model_dir)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa",
                                             dtype=torch.float32)
    parameters = sum(p.numel() for p in model.parameters())
    mesh = init_device_mesh("cpu", (world,))
    mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
          if args.dtype == "bf16" else MixedPrecisionPolicy())
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, eps=EPS,
                            weight_decay=WEIGHT_DECAY)
    gen = torch.Generator().manual_seed(1 + rank)
    vocab = config.vocab_size
    losses = []

    def step():
        tokens = torch.randint(0, vocab, (args.batch, args.seq + 1), generator=gen)
        inputs, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
        opt.zero_grad(set_to_none=True)
        logits = model(input_ids=inputs, use_cache=False).logits
        loss = F.cross_entropy(logits.float().view(-1, vocab), targets.view(-1))
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))

    result = timed_steps(args, step)
    dist.barrier()
    dist.destroy_process_group()
    result.update(parameters=parameters, losses=losses, torch_version=torch.__version__,
                  transformers_version=transformers.__version__)
    return result


def worker_main(args):
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    port = int(os.environ["MASTER_PORT"])
    fn = shardkit_worker if args.framework == "shardkit" else torch_worker
    result = fn(args, rank, world, port)
    result["rank"] = rank
    print("RESULT " + json.dumps(result), flush=True)


def run(args, framework, model_dir, seq, dtype, lib=None):
    port = free_port()
    procs = []
    for rank in range(args.world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(args.world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
                   MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
                   LOCAL_WORLD_SIZE=str(os.cpu_count() or 1))
        python = args.torch_python if framework == "torch" else sys.executable
        cmd = [python, os.path.abspath(__file__), "--worker", "--framework=" + framework,
               "--model_dir=" + model_dir, "--batch=%d" % args.batch, "--seq=%d" % seq,
               "--dtype=" + dtype, "--steps=%d" % args.steps, "--warmup=%d" % args.warmup,
               "--lib=" + (lib or args.lib)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    results, errors = [], []
    for p in procs:
        out, err = p.communicate(timeout=args.timeout)
        lines = [l for l in out.splitlines() if l.startswith("RESULT ")]
        if p.returncode != 0 or not lines:
            errors.append("exit %d: %s" % (p.returncode, err.strip()[-2000:]))
        else:
            results.append(json.loads(lines[-1][len("RESULT "):]))
    if errors:
        raise RuntimeError("%s %s seq %d %s failed:\n%s" % (framework, model_dir, seq, dtype,
                                                            "\n".join(errors)))
    steps = len(results[0]["wall"])
    return {
        "wall_s": statistics.median(max(r["wall"][i] for r in results) for i in range(steps)),
        "cpu_s_per_rank": statistics.mean(statistics.median(r["cpu"]) for r in results),
        "cpu_s_job": sum(statistics.median(r["cpu"]) for r in results),
        "peak_rss_mib": max(r["max_rss_mib"] for r in results),
        "parameters": results[0]["parameters"],
        "losses_rank0": results[0]["losses"],
        "torch_version": results[0].get("torch_version"),
        "transformers_version": results[0].get("transformers_version"),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="llama-10m,llama-100m")
    ap.add_argument("--seqs", default="512,2048")
    ap.add_argument("--dtypes", default="f32,bf16")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1, help="sequences per rank")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--reps", type=int, default=1,
                    help="repetitions, interleaved (every configuration and side once, then "
                         "again); the table gives each side's median over them")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--fma_peak_gflops", type=float, default=0.0,
                    help="the machine's f32 FMA peak per CPU-second of one thread (step_breakdown "
                         "prints it), recorded beside the numbers")
    ap.add_argument("--lib", default="bazel-bin/capi/libshardkit.so")
    ap.add_argument("--lib_before", default="",
                    help="a second optimised libshardkit.so (e.g. main's, before a change): each "
                         "row then runs it too, before this one and PyTorch, and gives its ratio")
    ap.add_argument("--torch_python", default=sys.executable)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--out", default="", help="write every run's figures here (JSON)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--framework", help=argparse.SUPPRESS)
    ap.add_argument("--model_dir", help=argparse.SUPPRESS)
    ap.add_argument("--seq", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--dtype", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.lib = os.path.abspath(args.lib)
    if args.worker:
        return worker_main(args)

    models = [m for m in args.models.split(",") if m]
    for m in models:
        if m not in MODELS:
            sys.exit("unknown model %s (known: %s)" % (m, ", ".join(MODELS)))
    seqs = [int(s) for s in args.seqs.split(",") if s]
    dtypes = [d for d in args.dtypes.split(",") if d]
    if any(d not in ("f32", "bf16") for d in dtypes) or not seqs or min(seqs) < 1:
        sys.exit("--dtypes takes f32,bf16; --seqs positive integers")
    if args.reps < 1:
        sys.exit("--reps takes a positive integer")
    real = os.path.realpath(args.lib)
    if not os.path.exists(real) or "fastbuild" in real or "-dbg" in real:
        sys.exit("%s is not an optimised build: ./bazelw build -c opt //capi:libshardkit.so"
                 % args.lib)
    work = tempfile.mkdtemp(prefix="sk_llama_compare_")
    args.lib = shutil.copy2(real, os.path.join(work, "libshardkit.so"))
    sides = ["shardkit", "torch"]
    if args.lib_before:
        before = os.path.realpath(args.lib_before)
        if not os.path.exists(before):
            sys.exit("--lib_before %s does not exist" % args.lib_before)
        os.makedirs(os.path.join(work, "before"))
        args.lib_before = shutil.copy2(before, os.path.join(work, "before", "libshardkit.so"))
        sides = ["shardkit_before", "shardkit", "torch"]
    report = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "cpu": platform_cpu(), "cores": os.cpu_count(), "world": args.world,
              "batch_per_rank": args.batch, "warmup": args.warmup, "steps": args.steps,
              "reps": args.reps,
              "fma_peak_gflops_per_cpu_second": args.fma_peak_gflops or None, "runs": []}
    print("machine: %d cores; %s" % (os.cpu_count(), report["cpu"]), flush=True)
    rows = {}  # (model, seq, dtype) -> row
    for model in models:
        write_config(os.path.join(work, model), model, max(seqs))
    for rep in range(args.reps):
        for model in models:
            model_dir = os.path.join(work, model)
            for seq in seqs:
                for dtype in dtypes:
                    row = rows.setdefault((model, seq, dtype),
                                          {"model": model, "seq": seq, "dtype": dtype, "reps": {}})
                    for framework in sides:
                        load0 = os.getloadavg()[0]
                        if framework == "shardkit_before":
                            r = run(args, "shardkit", model_dir, seq, dtype, lib=args.lib_before)
                        else:
                            r = run(args, framework, model_dir, seq, dtype)
                        r["load"] = [load0, os.getloadavg()[0]]
                        row["reps"].setdefault(framework, []).append(r)
                        print("rep %d %-10s seq %4d %-4s %-15s %8.3f CPU-s/step/rank, %8.3f s wall, "
                              "rss %6.0f MiB, %d params, loss %s, load %.1f->%.1f" %
                              (rep + 1, model, seq, dtype, framework, r["cpu_s_per_rank"],
                               r["wall_s"], r["peak_rss_mib"], r["parameters"],
                               " ".join("%.3f" % l for l in r["losses_rank0"]), r["load"][0],
                               r["load"][1]), flush=True)
    for key, row in rows.items():
        # Each side's figures: the median over repetitions of its per-run
        # CPU-s/step/rank and wall, the largest peak RSS, every run's load.
        for framework, runs in row["reps"].items():
            row[framework] = {
                "cpu_s_per_rank": statistics.median(r["cpu_s_per_rank"] for r in runs),
                "cpu_s_per_rank_runs": [r["cpu_s_per_rank"] for r in runs],
                "wall_s": statistics.median(r["wall_s"] for r in runs),
                "peak_rss_mib": max(r["peak_rss_mib"] for r in runs),
                "parameters": runs[0]["parameters"],
                "losses_rank0": runs[0]["losses_rank0"],
                "load": [min(min(r["load"]) for r in runs), max(max(r["load"]) for r in runs)],
            }
        sk, pt = row["shardkit"], row["torch"]
        if sk["parameters"] != pt["parameters"]:
            sys.exit("PARAMETER COUNTS DIFFER: shardkit %d, torch %d (%s)" %
                     (sk["parameters"], pt["parameters"], key[0]))
        row["cpu_ratio"] = sk["cpu_s_per_rank"] / pt["cpu_s_per_rank"]
        row["rss_ratio"] = sk["peak_rss_mib"] / pt["peak_rss_mib"]
        if "shardkit_before" in row:
            row["cpu_ratio_before"] = (row["shardkit_before"]["cpu_s_per_rank"] /
                                       pt["cpu_s_per_rank"])
        report["runs"].append(row)
    print("\n| model | seq | dtype | shardkit CPU-s/step/rank | PyTorch FSDP2 | ratio | "
          "shardkit peak RSS MiB | PyTorch | ratio | load |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in report["runs"]:
        sk, pt = row["shardkit"], row["torch"]
        loads = sk["load"] + pt["load"]
        print("| %s | %d | %s | %.3f | %.3f | %.2f | %.0f | %.0f | %.2f | %.1f-%.1f |" %
              (row["model"], row["seq"], row["dtype"], sk["cpu_s_per_rank"], pt["cpu_s_per_rank"],
               row["cpu_ratio"], sk["peak_rss_mib"], pt["peak_rss_mib"], row["rss_ratio"],
               min(loads), max(loads)))
    if args.lib_before:
        print("\n| model | seq | dtype | shardkit before CPU-s/step/rank | after | PyTorch | "
              "before / PyTorch | after / PyTorch | load |")
        print("|---|---|---|---|---|---|---|---|---|")
        for row in report["runs"]:
            sb, sk, pt = row["shardkit_before"], row["shardkit"], row["torch"]
            loads = sb["load"] + sk["load"] + pt["load"]
            print("| %s | %d | %s | %.3f | %.3f | %.3f | %.2f | %.2f | %.1f-%.1f |" %
                  (row["model"], row["seq"], row["dtype"], sb["cpu_s_per_rank"],
                   sk["cpu_s_per_rank"], pt["cpu_s_per_rank"], row["cpu_ratio_before"],
                   row["cpu_ratio"], min(loads), max(loads)))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()

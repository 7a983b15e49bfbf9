#!/usr/bin/python3
"""Performance tracking for CI: runs the micro-benchmarks, turns their results
into same-run ratios, and compares them with a committed baseline through
Google Benchmark's compare.py (libbenchmark-tools).

    /usr/bin/python3 benchmarks/track.py --quick            # CI (.ci/run)
    /usr/bin/python3 benchmarks/track.py                    # fuller, slower
    /usr/bin/python3 benchmarks/track.py --quick --update_baseline

Why ratios: absolute times on a 2-core machine shared with other jobs swing by
tens of percent from one minute to the next. A ratio of two measurements taken
in the same run (FSDP step over DDP step, memcpy bandwidth over collective
busbw, FMA peak over GEMM rate, cached over raw allocation) cancels most of
that: both sides slow down together. Every tracked metric is "lower is
better" (bandwidths and rates are inverted), so compare.py's relative change
of real_time is directly the regression.

Each benchmark runs REPETITIONS times and the fastest repetition counts:
interference from other jobs only ever adds time, so minima repeat best.

Thresholds (change = current / baseline - 1), from back-to-back runs on the
2-core development machine while other jobs loaded it (min of 3 repetitions):
  memory         peak memory ratios, allocator peak reserved. Moved at most
                 4% (8% from single samples): +20% fails, in both forms; a
                 leaked or never-resharded buffer costs more.
  time           collectives (memcpy/busbw), allocator (cached/raw), kernels
                 (peak/GEMM). Moved at most +30%: +100% fails in both forms
                 (a doubling: a serialised collective, a lost cache).
  fsdp_step time FSDP step time over DDP's. Four rank threads on two cores
                 depend on the scheduler: moved up to +242%, so +300% fails
                 in the full form and --quick only warns (a gate that fails
                 on noise is a flaky gate).
--time_threshold overrides both time thresholds and makes them gate.
Exit 0 when nothing regressed, 1 on a regression, 2 when a benchmark failed.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMPARE = "/usr/share/benchmark/compare.py"
TARGETS = ["allocator", "collectives", "kernels", "fsdp_step"]
MEMORY_THRESHOLD = 0.20
# Each benchmark runs this many times and the fastest counts (see by_name).
REPETITIONS = 3
TIME_THRESHOLD = 1.00
FSDP_STEP_TIME_THRESHOLD = 3.00


def run_json(argv):
    """Runs a benchmark binary that prints JSON on stdout; returns the parsed document."""
    print("track.py: running", " ".join(os.path.relpath(a, ROOT) if a.startswith(ROOT) else a for a in argv),
          file=sys.stderr, flush=True)
    out = subprocess.run(argv, cwd=ROOT, stdout=subprocess.PIPE, check=True).stdout.decode()
    return json.JSONDecoder().raw_decode(out[out.index("{"):])[0]  # fsdp_step adds a summary after it


def by_name(doc):
    """The fastest repetition of each benchmark (with its counters). Interference
    from other jobs only ever adds time, so the minimum over repetitions is the
    most repeatable estimate on a shared machine."""
    best = {}
    for b in doc.get("benchmarks", []):
        if b.get("run_type", "iteration") != "iteration" or "error_occurred" in b:
            continue
        name = b.get("run_name", b["name"])
        if name not in best or b["real_time"] < best[name]["real_time"]:
            best[name] = b
    return best


def measure(bin_dir, quick):
    """Returns {metric name: (value, kind)}; kind is 'time' or 'memory'."""
    metrics = {}

    # FSDP step time and peak memory as ratios to DDP (fsdp_step.cc).
    flt = "BM_Step/(compute|states)/(DDP|FULL_SHARD|NO_SHARD)/" if quick else "BM_Step/"
    runs = by_name(run_json([os.path.join(bin_dir, "fsdp_step"), "--benchmark_format=json",
                             "--benchmark_filter=" + flt, "--benchmark_repetitions=%d" % REPETITIONS]))
    steps = {"/".join(n.split("/")[1:3]): b for n, b in runs.items()}  # "compute/FULL_SHARD"
    for key, b in steps.items():
        setup, strategy = key.split("/")
        base = steps.get(setup + "/DDP")
        if strategy == "DDP" or base is None:
            continue
        metrics["fsdp_step/%s/time_over_ddp" % key] = (b["real_time"] / base["real_time"], "time")
        metrics["fsdp_step/%s/peak_alloc_over_ddp" % key] = (b["peak_alloc_MiB"] / base["peak_alloc_MiB"], "memory")

    # Collective busbw against memcpy bandwidth in the same run (collectives.cc).
    # Small sizes are latency-bound and swing several-fold under load: quick
    # tracks the bandwidth-bound sizes only.
    sizes = "16777216,67108864" if quick else "1048576,16777216,67108864"
    memcpy, busbw = 0, {}
    for _ in range(REPETITIONS):
        coll = run_json([os.path.join(bin_dir, "collectives"), "--benchmark_format=json", "--backends=local",
                         "--ranks=4", "--sizes=" + sizes, "--iters=" + ("5" if quick else "9")])
        memcpy = max(memcpy, coll["context"]["memcpy_4_threads_GBps"])
        for b in coll["benchmarks"]:
            # busbw of the fastest iteration: busbw scales inversely with time.
            best = b["busbw_GBps"] * b["time_us_median"] / b["time_us_min"] if b["time_us_min"] > 0 else 0
            busbw[b["name"]] = max(busbw.get(b["name"], 0), best)
    for name, bw in busbw.items():
        if bw > 0:
            metrics["collectives/%s/memcpy_over_busbw" % name] = (memcpy / bw, "time")

    # GEMM rate against the measured FMA peak (kernels.cc). Not in --quick:
    # a one-iteration peak and a short GEMM under load moved this ratio 10x.
    if not quick:
        kern = by_name(run_json([os.path.join(bin_dir, "kernels"), "--benchmark_format=json",
                                 "--benchmark_filter=BM_PeakFma/2|BM_Gemm/lib:1/", "--benchmark_min_time=0.5",
                                 "--benchmark_repetitions=%d" % REPETITIONS]))
        peak = next((b["GFLOP/s"] for n, b in kern.items() if n.startswith("BM_PeakFma/2")), None)
        for name, b in kern.items():
            if name.startswith("BM_Gemm") and peak and b.get("GFLOP/s"):
                metrics["kernels/%s/peak_over_gflops" % name.replace("/real_time", "")] = (peak / b["GFLOP/s"], "time")

    # The caching allocator against raw device allocation; peak reserved near the cap.
    alloc = by_name(run_json([os.path.join(bin_dir, "allocator"), "--benchmark_format=json",
                              "--benchmark_filter=BM_RawDeviceAllocFree|BM_CachedAllocFree/|BM_FragmentationNearCap",
                              "--benchmark_min_time=" + ("0.05" if quick else "0.2"),
                              "--benchmark_repetitions=%d" % REPETITIONS]))
    for name, b in alloc.items():
        if name.startswith("BM_CachedAllocFree/"):
            raw = alloc.get(name.replace("BM_CachedAllocFree", "BM_RawDeviceAllocFree"))
            if raw:
                metrics["allocator/%s/cached_over_raw" % name] = (b["real_time"] / raw["real_time"], "time")
        if name.startswith("BM_FragmentationNearCap") and "peak_reserved_MiB" in b:
            metrics["allocator/%s/peak_reserved_MiB" % name] = (b["peak_reserved_MiB"], "memory")
    return metrics


def to_gbench(metrics, quick):
    """The metrics as Google Benchmark JSON (value in real_time), which compare.py reads."""
    return {
        "context": {"library_build_type": "release", "shardkit_track": "quick" if quick else "full",
                    "note": "same-run ratios, lower is better; kind says which threshold applies"},
        "benchmarks": [{"name": name, "run_name": name, "run_type": "iteration", "repetitions": 1,
                        "repetition_index": 0, "threads": 1, "iterations": 1, "real_time": value,
                        "cpu_time": value, "time_unit": "ns", "kind": kind}
                       for name, (value, kind) in sorted(metrics.items())],
    }


def compare(baseline_path, current_path):
    """compare.py's verdict per benchmark: {name: relative change of real_time}."""
    with tempfile.NamedTemporaryFile(suffix=".json") as dump:
        proc = subprocess.run(["/usr/bin/python3", COMPARE, "--no-color", "--no-utest", "-d", dump.name,
                               "benchmarks", baseline_path, current_path],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        print(proc.stdout.decode())
        if proc.returncode != 0:
            raise RuntimeError("compare.py failed")
        with open(dump.name) as f:
            diff = json.load(f)
    return {d["name"]: d["measurements"][0]["time"] for d in diff
            if d.get("measurements") and d["name"] != "OVERALL_GEOMEAN"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the CI form: a few minutes on 2 cores")
    ap.add_argument("--update_baseline", action="store_true", help="write this run as the new baseline")
    ap.add_argument("--time_threshold", type=float, default=None)
    ap.add_argument("--baseline", default=None, help="default benchmarks/baseline/{quick,full}.json")
    ap.add_argument("--bazel", default=None, help="build command (default ./bazelw, else bazel)")
    ap.add_argument("--no_build", action="store_true", help="use the binaries already in bazel-bin")
    args = ap.parse_args()
    def threshold(name, kind):
        """(limit, gating) for a metric."""
        if kind == "memory":
            return MEMORY_THRESHOLD, True
        if args.time_threshold is not None:
            return args.time_threshold, True
        if name.startswith("fsdp_step/"):
            return FSDP_STEP_TIME_THRESHOLD, not args.quick
        return TIME_THRESHOLD, True
    baseline = args.baseline or os.path.join(ROOT, "benchmarks", "baseline", ("quick" if args.quick else "full") + ".json")

    if not args.no_build:
        bazel = args.bazel or (os.path.join(ROOT, "bazelw") if os.path.exists(os.path.join(ROOT, "bazelw")) else "bazel")
        subprocess.run([bazel, "build", "-c", "opt"] + ["//benchmarks:" + t for t in TARGETS], cwd=ROOT, check=True)
    bin_dir = os.path.join(ROOT, "bazel-bin", "benchmarks")
    try:
        metrics = measure(bin_dir, args.quick)
    except (subprocess.CalledProcessError, ValueError, KeyError) as e:
        print("track.py: a benchmark failed:", e, file=sys.stderr)
        return 2
    current = to_gbench(metrics, args.quick)

    if args.update_baseline:
        os.makedirs(os.path.dirname(baseline), exist_ok=True)
        with open(baseline, "w") as f:
            json.dump(current, f, indent=1)
            f.write("\n")
        print("track.py: baseline written to", os.path.relpath(baseline, ROOT), "(%d metrics)" % len(metrics))
        return 0
    if not os.path.exists(baseline):
        print("track.py: no baseline at %s; run with --update_baseline" % baseline, file=sys.stderr)
        return 2
    with open(baseline) as f:
        kinds = {b["name"]: b.get("kind", "time") for b in json.load(f)["benchmarks"]}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(current, f)
        current_path = f.name
    try:
        changes = compare(baseline, current_path)
    finally:
        os.unlink(current_path)
    regressions, warnings = [], []
    for name, change in sorted(changes.items()):
        limit, gating = threshold(name, kinds.get(name, "time"))
        if change > limit:
            line = "%s: %+.1f%% (threshold %+.0f%%)" % (name, change * 100, limit * 100)
            (regressions if gating else warnings).append(line)
    missing = sorted(set(kinds) - set(metrics))
    print("track.py: %d metrics compared; thresholds: memory %+.0f%%, time %+.0f%%, fsdp_step time %+.0f%%%s" %
          (len(changes), MEMORY_THRESHOLD * 100, TIME_THRESHOLD * 100, FSDP_STEP_TIME_THRESHOLD * 100,
           " (warning only in --quick)" if args.quick else ""))
    for w in warnings:
        print("track.py: warning (not gating in --quick)", w)
    for m in missing:
        print("track.py: missing from this run:", m)
    for r in regressions:
        print("track.py: REGRESSION", r)
    if regressions or missing:
        return 1
    print("track.py: no regression")
    return 0


if __name__ == "__main__":
    sys.exit(main())

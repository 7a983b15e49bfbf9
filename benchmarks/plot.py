#!/usr/bin/python3
"""Renders the paper harnesses' PNG plots from the CSVs in an output folder.

    python3 benchmarks/plot.py OUT_DIR

Run by the harnesses after their measurements. Exits 3 when matplotlib is
missing (the harness then says so; CSV and JSON are complete without plots),
2 on bad usage. Plots that used a network model say so in their title.
"""
import csv
import os
import sys


def read(out, name):
    path = os.path.join(out, name + ".csv")
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def num(row, key):
    try:
        return float(row.get(key, ""))
    except ValueError:
        return None


def network_note(rows):
    labels = sorted({r.get("network", "") for r in rows if "network model" in r.get("network", "")})
    return ("\n" + labels[0]) if labels else "\nlocal backend, no network model"


def bar_groups(ax, groups, series, values, ylabel, marks=None):
    """Grouped bars: one group per entry of `groups`, one bar per series."""
    width = 0.8 / max(1, len(series))
    for j, s in enumerate(series):
        xs = [i + (j - (len(series) - 1) / 2) * width for i in range(len(groups))]
        ys = [values.get((g, s)) for g in groups]
        ax.bar(xs, [y if y is not None else 0 for y in ys], width, label=s)
        for x, y, g in zip(xs, ys, groups):
            mark = marks.get((g, s)) if marks else None
            if mark:
                ax.text(x, (y or 0), mark, ha="center", va="bottom", fontsize=6, rotation=90)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, fontsize=8)
    ax.set_ylabel(ylabel)


def plot_ddp_vs_fsdp(plt, out, rows):
    if not rows:
        return None
    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
    fig, axes = plt.subplots(2, len(dtypes), figsize=(6 * len(dtypes), 7), squeeze=False)
    cap = num(rows[0], "memory_cap_mib")
    for c, dtype in enumerate(dtypes):
        sub = [r for r in rows if r["dtype"] == dtype]
        models = list(dict.fromkeys(r["model"] for r in sub))
        strategies = list(dict.fromkeys(r["strategy"] for r in sub))
        step = {(r["model"], r["strategy"]): num(r, "step_ms") for r in sub}
        mem = {(r["model"], r["strategy"]): num(r, "peak_alloc_mib") for r in sub}
        marks = {(r["model"], r["strategy"]): ("OOM" if r["status"] == "OOM" else None) for r in sub}
        bar_groups(axes[0][c], models, strategies, step, "step time (ms, median)", marks)
        axes[0][c].set_title("step time, %s" % dtype, fontsize=9)
        bar_groups(axes[1][c], models, strategies, mem, "peak allocated (MiB/rank)", marks)
        if cap:
            axes[1][c].axhline(cap, color="red", linestyle="--", linewidth=1, label="cap")
        axes[1][c].set_title("peak memory, %s (OOM: over the %s MiB cap)" % (dtype, rows[0]["memory_cap_mib"]),
                             fontsize=9)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("DDP vs FSDP strategies, world 4, scaled models" + network_note(rows), fontsize=10)
    return fig


def plot_prefetch(plt, out, rows):
    rows = [r for r in rows if r["status"] == "ok"]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    modes = [r["mode"] for r in rows]
    med = [num(r, "step_ms") for r in rows]
    lo = [m - num(r, "step_ms_min") for m, r in zip(med, rows)]
    hi = [num(r, "step_ms_max") - m for m, r in zip(med, rows)]
    ax.bar(range(len(modes)), med, yerr=[lo, hi], capsize=4, color="tab:blue")
    base = med[modes.index("none")] if "none" in modes else None
    for i, m in enumerate(med):
        if base:
            ax.text(i, m, "%+.1f%%" % ((base / m - 1) * 100), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(modes)))
    ax.set_xticklabels(modes, fontsize=8)
    ax.set_ylabel("step time (ms; bar = median, whiskers = min..max)")
    ax.set_title("backward prefetch, %s FULL_SHARD; speedup over none%s" % (rows[0]["model"], network_note(rows)),
                 fontsize=8)
    return fig


def plot_rate_limiter(plt, out, rows):
    if not rows:
        return None
    keys = list(dict.fromkeys((r["model"], r["setting"]) for r in rows))
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for model, setting in keys:
        sub = sorted([r for r in rows if r["model"] == model and r["setting"] == setting],
                     key=lambda r: num(r, "limit"))
        label = "%s %s" % (model, setting)
        xs = [("off" if num(r, "limit") == 0 else r["limit"]) for r in sub]
        axes[0].plot(xs, [num(r, "step_ms") for r in sub], marker="o", label=label)
        axes[1].plot(xs, [num(r, "peak_reserved_mib") for r in sub], marker="o", label=label)
        axes[2].plot(xs, [num(r, "alloc_retries") for r in sub], marker="o", label=label)
        for x, r in zip(xs, sub):
            if r["status"] != "ok":
                axes[2].annotate(r["status"], (x, num(r, "alloc_retries") or 0), fontsize=7,
                                 textcoords="offset points", xytext=(4, 4))
    axes[0].set_ylabel("step time (ms, median)")
    axes[1].set_ylabel("peak reserved (MiB/rank)")
    axes[2].set_ylabel("alloc retries (whole run; OOM marked)")
    for ax in axes:
        ax.set_xlabel("all_gather_limit")
    axes[0].legend(fontsize=7)
    fig.suptitle("rate limiter (FULL_SHARD, forward + backward prefetch)" + network_note(rows), fontsize=9)
    return fig


def plot_hybrid(plt, out, rows):
    rows = [r for r in rows if r["status"] == "ok"]
    if not rows:
        return None
    fig, axes = plt.subplots(1, 3, figsize=(12, 4))
    names = [r["strategy"] for r in rows]
    for ax, key, label in zip(axes, ["cross_host_mib_per_step", "step_ms", "peak_alloc_mib"],
                              ["cross-host MiB/rank/step", "step time (ms, median)", "peak allocated (MiB/rank)"]):
        ax.bar(range(len(names)), [num(r, key) for r in rows], color="tab:green")
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, fontsize=8)
        ax.set_ylabel(label)
    fig.suptitle("2 hosts x 2 ranks, %s%s" % (rows[0]["model"], network_note(rows)), fontsize=8)
    return fig


def main(argv):
    if len(argv) != 2:
        print("usage: plot.py OUT_DIR", file=sys.stderr)
        return 2
    out = argv[1]
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot.py: matplotlib is missing (apt-get install python3-matplotlib)", file=sys.stderr)
        return 3
    written = []
    for name, fn in [("ddp_vs_fsdp", plot_ddp_vs_fsdp), ("prefetch", plot_prefetch),
                     ("rate_limiter", plot_rate_limiter), ("hybrid", plot_hybrid)]:
        fig = fn(plt, out, read(out, name))
        if fig is None:
            continue
        fig.tight_layout()
        path = os.path.join(out, name + ".png")
        fig.savefig(path, dpi=80)
        plt.close(fig)
        written.append(path)
    for p in written:
        print("plot.py: wrote", p)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

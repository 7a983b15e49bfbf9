#!/usr/bin/python3
"""Renders the paper harnesses' PNG plots from the CSVs in an output folder.

    python3 benchmarks/paper/plot.py OUT_DIR

Run by the harnesses after their measurements. Exits 3 when matplotlib is
missing (the harness then says so; CSV and JSON are complete without plots),
2 on bad usage. Plots that used a network model say so in their title.
One figure per paper figure the measured harnesses reproduce: the paper's
value is a black star, measured step times carry min..max whiskers over the
repetitions (ratios: over the paired rounds), memory caps are red dashes.
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


def reps(row):
    """A row's repetition medians (rep_ms), or [] when it ran once."""
    out = []
    for item in (row.get("rep_ms") or "").split(";"):
        try:
            out.append(float(item))
        except ValueError:
            pass
    return out


def paired(num_row, den_row):
    """Per-round num/den step-time ratios (the rounds alternate; claims.cc pairs them the same way)."""
    a, b = reps(num_row), reps(den_row)
    return [x / y for x, y in zip(a, b) if y > 0]


def median(values):
    v = sorted(values)
    return v[len(v) // 2] if v else None


PAPER = dict(marker="*", color="black", markersize=11, linestyle="none", zorder=5)


def bar_groups(ax, groups, series, values, ylabel, marks=None, spread=None):
    """Grouped bars: one group per entry of `groups`, one bar per series;
    `spread[(g, s)] = (lo, hi)` draws min..max whiskers on that bar."""
    width = 0.8 / max(1, len(series))
    centers = {}
    for j, s in enumerate(series):
        xs = [i + (j - (len(series) - 1) / 2) * width for i in range(len(groups))]
        ys = [values.get((g, s)) for g in groups]
        ax.bar(xs, [y if y is not None else 0 for y in ys], width, label=s)
        for x, y, g in zip(xs, ys, groups):
            centers[(g, s)] = x
            lohi = spread.get((g, s)) if spread else None
            if lohi and y is not None:
                ax.errorbar([x], [y], yerr=[[y - lohi[0]], [lohi[1] - y]], color="black", capsize=3,
                            linewidth=1)
            mark = marks.get((g, s)) if marks else None
            if mark:
                ax.text(x, (y or 0), mark, ha="center", va="bottom", fontsize=7, rotation=90)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    return centers


def plot_ddp_vs_fsdp(plt, out, rows):
    """The paper's FSDP-vs-DDP figure: speed (T5-611M/2.28B parity) and memory (DDP OOM above 2.28B)."""
    if not rows:
        return None
    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
    fig, axes = plt.subplots(2, len(dtypes), figsize=(6.5 * len(dtypes), 7.5), squeeze=False)
    cap = num(rows[0], "memory_cap_mib")
    for c, dtype in enumerate(dtypes):
        sub = [r for r in rows if r["dtype"] == dtype]
        models = list(dict.fromkeys(r["model"] for r in sub))
        strategies = list(dict.fromkeys(r["strategy"] for r in sub))
        step = {(r["model"], r["strategy"]): num(r, "step_ms") for r in sub}
        mem = {(r["model"], r["strategy"]): num(r, "peak_alloc_mib") for r in sub}
        marks = {(r["model"], r["strategy"]): ("OOM" if r["status"] == "OOM" else None) for r in sub}
        spread = {(r["model"], r["strategy"]): (num(r, "step_ms_min"), num(r, "step_ms_max"))
                  for r in sub if len(reps(r)) > 1}
        centers = bar_groups(axes[0][c], models, strategies, step, "step time (ms); whiskers: min..max of "
                             "the repetitions", marks, spread)
        # The paper: FULL_SHARD as fast as DDP, drawn at DDP's time on the FULL_SHARD bar.
        first = True
        for model in models:
            ddp = step.get((model, "DDP"))
            if ddp and (model, "FULL_SHARD") in centers and marks.get((model, "DDP")) is None:
                axes[0][c].plot([centers[(model, "FULL_SHARD")]], [ddp], label="paper: FULL_SHARD = DDP"
                                if first else None, **PAPER)
                first = False
        axes[0][c].set_title("step time, %s (DDP vs FULL_SHARD repeated, alternating)" % dtype, fontsize=9)
        bar_groups(axes[1][c], models, strategies, mem, "peak allocated (MiB/rank)", marks)
        if cap:
            axes[1][c].axhline(cap, color="red", linestyle="--", linewidth=1.2,
                               label="memory cap %s MiB (plays the 80 GB A100)" % rows[0]["memory_cap_mib"])
        axes[1][c].set_title("peak memory, %s (OOM: over the cap; paper: DDP OOMs above T5-2.28B, FSDP "
                             "trains T5-11B)" % dtype, fontsize=8)
        axes[1][c].legend(fontsize=7)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("DDP vs FSDP strategies, world 4, scaled models" + network_note(rows), fontsize=10)
    return fig


def plot_prefetch(plt, out, rows):
    """The paper's backward-prefetch figure (GPT-175B: about 18% faster), with the null control."""
    rows = [r for r in rows if r["status"] == "ok"]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    x = 0
    ticks, labels = [], []
    paper_drawn = False
    for network, color, title in [("calibrated", "tab:blue", "behind the calibrated link"),
                                  ("off", "tab:gray", "null control: no network model")]:
        sub = [r for r in rows if r.get("network_model", "calibrated") == network]
        base = next((r for r in sub if r["mode"] == "none"), None)
        if base is None:
            continue
        legend = title
        for r in sub:
            if r["mode"] == "none":
                continue
            ratios = [v - 1 for v in paired(base, r)] or [num(base, "step_ms") / num(r, "step_ms") - 1]
            m = median(ratios) * 100
            ax.bar([x], [m], color=color, label=legend)
            legend = None
            if len(ratios) > 1:
                ax.errorbar([x], [m], yerr=[[m - min(ratios) * 100], [max(ratios) * 100 - m]], color="black",
                            capsize=4, linewidth=1)
            ax.text(x, m, " %+.1f%%" % m, ha="left", va="bottom", fontsize=7)
            if network == "calibrated" and r["mode"] == "BACKWARD_PRE":
                ax.plot([x], [18], label="paper: BACKWARD_PRE +18% (GPT-175B)", **PAPER)
                paper_drawn = True
            ticks.append(x)
            labels.append(r["mode"] + ("\n(no network)" if network == "off" else ""))
            x += 1
        x += 0.5
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(ticks)
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_ylabel("speedup over no prefetch (%); median and\nmin..max of the paired rounds", fontsize=8)
    ax.set_title("backward prefetch, %s FULL_SHARD%s%s" % (rows[0]["model"], network_note(rows),
                 "" if paper_drawn else " (BACKWARD_PRE did not run)"), fontsize=8)
    ax.legend(fontsize=7)
    return fig


def plot_rate_limiter(plt, out, rows):
    """The paper's rate-limiter figure: speedup per limit (T5-11B up to 5x, RegNet ~0, DeepViT ~-5%), memory."""
    if not rows:
        return None
    keys = list(dict.fromkeys((r["model"], r["setting"]) for r in rows))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for model, setting in keys:
        sub = sorted([r for r in rows if r["model"] == model and r["setting"] == setting],
                     key=lambda r: num(r, "limit"))
        label = "%s %s" % (model, setting)
        off = next((r for r in sub if num(r, "limit") == 0 and r["status"] == "ok"), None)
        xs, ys, lo, hi = [], [], [], []
        for r in sub:
            if off is None or r is off or r["status"] != "ok":
                continue
            ratios = paired(off, r) or [num(off, "step_ms") / num(r, "step_ms")]
            m = median(ratios)
            xs.append(r["limit"])
            ys.append(m)
            lo.append(m - min(ratios))
            hi.append(max(ratios) - m)
        if xs:
            axes[0].errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label=label)
        limits = [("off" if num(r, "limit") == 0 else r["limit"]) for r in sub]
        axes[1].plot(limits, [num(r, "peak_reserved_mib") for r in sub], marker="o", label=label)
        if setting == "near cap" and num(sub[0], "memory_cap_mib"):
            axes[1].axhline(num(sub[0], "memory_cap_mib"), color="red", linestyle="--", linewidth=1.2,
                            label="near-cap memory cap (%s MiB)" % sub[0]["memory_cap_mib"])
        axes[2].plot(limits, [num(r, "alloc_retries") for r in sub], marker="o", label=label)
        for x, r in zip(limits, sub):
            if r["status"] != "ok":
                for ax, key in [(axes[1], "peak_reserved_mib"), (axes[2], "alloc_retries")]:
                    ax.annotate(r["status"], (x, num(r, key) or 0), fontsize=7, textcoords="offset points",
                                xytext=(4, 4))
    for value, text, dy in [(5.0, "paper: T5-11B up to 5x", 2), (1.0, "paper: RegNet-9B ~1x", 3),
                            (0.95, "paper: DeepViT-8B ~0.95x", -10)]:
        axes[0].axhline(value, color="black", linestyle=":", linewidth=0.8)
        axes[0].plot([0], [value], **PAPER)
        axes[0].annotate(text, (0, value), fontsize=7, textcoords="offset points", xytext=(8, dy))
    axes[0].set_yscale("log")
    axes[0].set_ylabel("speedup: off's step time / limit K's\n(median, min..max of paired rounds)", fontsize=8)
    axes[1].set_ylabel("peak reserved (MiB/rank)", fontsize=8)
    axes[2].set_ylabel("alloc retries (whole run; OOM marked)", fontsize=8)
    for ax in axes:
        ax.set_xlabel("all_gather_limit", fontsize=8)
        ax.legend(fontsize=7)
    fig.suptitle("rate limiter (FULL_SHARD, forward + backward prefetch)" + network_note(rows), fontsize=9)
    return fig


def plot_hybrid(plt, out, rows):
    """The paper's hybrid-sharding figure: cross-host traffic against its formulas, speed, memory."""
    rows = [r for r in rows if r["status"] == "ok"]
    if not rows:
        return None
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.5))
    names = [r["strategy"] for r in rows]
    xs = range(len(names))
    # The paper's formulas (M = f32 parameter bytes, W = 4, G = shard group size).
    m = (num(rows[0], "params_m") or 0) * 1e6 * 4 / (1 << 20)
    w = 4.0
    formula = {"FULL_SHARD": 3 * m * (w - 1) / w, "NO_SHARD": 2 * m * (w - 1) / w}
    for r in rows:
        if r["strategy"] == "HYBRID_SHARD":
            g = num(r, "shard_group_size") or 2
            formula["HYBRID_SHARD"] = 2 * m * (w - 1) / (g * w)
    axes[0].bar(xs, [num(r, "cross_host_mib_per_step") for r in rows], color="tab:green")
    axes[0].plot(list(xs), [formula.get(n) for n in names], label="paper's formula", **PAPER)
    axes[0].legend(fontsize=7)
    axes[0].set_ylabel("cross-host MiB/rank/step", fontsize=8)
    med = [num(r, "step_ms") for r in rows]
    lo = [x - (num(r, "step_ms_min") or x) for x, r in zip(med, rows)]
    hi = [(num(r, "step_ms_max") or x) - x for x, r in zip(med, rows)]
    axes[1].bar(xs, med, yerr=[lo, hi], capsize=4, color="tab:green")
    axes[1].set_ylabel("step time (ms); whiskers: min..max of the repetitions", fontsize=8)
    axes[2].bar(xs, [num(r, "peak_alloc_mib") for r in rows], color="tab:green")
    axes[2].set_ylabel("peak allocated (MiB/rank)", fontsize=8)
    for ax in axes:
        ax.set_xticks(list(xs))
        ax.set_xticklabels(names, fontsize=8)
    fig.suptitle("2 hosts x 2 ranks, %s (paper: hybrid trades memory for speed on a slow cross-host link)%s"
                 % (rows[0]["model"], network_note(rows)), fontsize=8)
    return fig


def plot_simulated(plt, out, rows):
    """The paper's figures at the paper's scale, simulated: one panel per figure
    (claims_simulated_points.csv, written by sim_claims.cc), the paper's value
    a black star beside each simulated bar, the device's capacity red dashes
    on the memory panels."""
    if not rows:
        return None
    capacity, profile = None, ""
    for r in rows:
        if r["figure"] == "capacity":
            capacity, profile = num(r, "value"), r["x"]
    panels = [("parity", "FSDP vs DDP (8 GPUs)"), ("prefetch", "backward prefetch, GPT-175B on 128 GPUs"),
              ("limiter", "rate limiter: off / limit-2 step time (8 GPUs)"),
              ("limiter_memory", "rate limiter: peak reserved per GPU"),
              ("gpt175b_scaling", "GPT-175B TFLOPS per GPU"), ("t5_11b_scaling", "T5-11B scaling"),
              ("hybrid", "HYBRID_SHARD vs FULL_SHARD (64 GPUs)"), ("hybrid_memory", "peak reserved per GPU"),
              ("hybrid_traffic", "cross-node traffic per GPU per step")]
    panels = [(f, t) for f, t in panels if any(r["figure"] == f for r in rows)]
    if not panels:
        return None
    cols = 2
    nrows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(11, 3.2 * nrows), squeeze=False)
    for i, (figure, title) in enumerate(panels):
        ax = axes[i // cols][i % cols]
        sub = [r for r in rows if r["figure"] == figure]
        series = []
        for r in sub:
            if r["series"] not in series:
                series.append(r["series"])
        xs = []
        for r in sub:
            if r["x"] not in xs:
                xs.append(r["x"])
        width = 0.8 / len(series)
        starred = False
        for j, name in enumerate(series):
            label = name  # on the series' first bar only
            for r in sub:
                if r["series"] != name:
                    continue
                x = xs.index(r["x"]) + (j - (len(series) - 1) / 2) * width
                v = num(r, "value")
                ax.bar([x], [v], width=width * 0.9, color="C%d" % j, label=label)
                label = None
                ax.text(x, v, " %.3g" % v, ha="center", va="bottom", fontsize=6)
                p = num(r, "paper")
                if p is not None:
                    ax.plot([x], [p], label=None if starred else "paper", **PAPER)
                    starred = True
        if figure.endswith("memory") and capacity is not None:
            ax.axhline(capacity, color="red", linestyle="--", linewidth=1, label="device capacity")
        if figure in ("parity", "limiter", "hybrid"):
            ax.axhline(1, color="black", linewidth=0.6)
        if figure == "prefetch":
            ax.axhline(0, color="black", linewidth=0.6)
        ax.set_xticks(range(len(xs)))
        ax.set_xticklabels(xs, fontsize=7)
        ax.set_title(title, fontsize=8)
        ax.tick_params(axis="y", labelsize=7)
        ax.legend(fontsize=6)
    for i in range(len(panels), nrows * cols):
        axes[i // cols][i % cols].axis("off")
    fig.suptitle("simulated at the paper's scale%s: bars ours, stars the paper's" %
                 (" (" + profile + ")" if profile else ""), fontsize=9)
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
                     ("rate_limiter", plot_rate_limiter), ("hybrid", plot_hybrid),
                     ("claims_simulated", plot_simulated)]:
        fig = fn(plt, out, read(out, name + ("_points" if name == "claims_simulated" else "")))
        if fig is None:
            continue
        fig.tight_layout()
        path = os.path.join(out, name + ".png")
        fig.savefig(path, dpi=150)
        plt.close(fig)
        written.append(path)
    for p in written:
        print("plot.py: wrote", p)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

#!/usr/bin/env python3
"""Writes report.md from a run.sh output directory: per test binary the
GoogleTest counts (passed, failed, skipped with the skip reasons), per
benchmark binary its numbers (every counter Google Benchmark recorded), and
the simulator's CPU calibration and validation reports (sim/*.md)."""
import glob
import json
import os
import re
import sys


def harness_counts(log_path):
    """(passed, failed, skipped) from the frontends' own harnesses' summary
    lines: Rust's "test result: ok. 12 passed; 0 failed; 1 ignored; ..." (one
    per test binary section) and the Lua test's "12 passed, 0 failed"; None
    when the log has neither (the program died before its summary)."""
    try:
        text = open(log_path).read()
    except OSError:
        return None
    rust = re.findall(r"test result: \w+\. (\d+) passed; (\d+) failed; (\d+) ignored", text)
    if rust:
        return tuple(sum(int(r[i]) for r in rust) for i in range(3))
    lua = re.findall(r"^(\d+) passed, (\d+) failed$", text, re.M)
    if lua:
        return int(lua[-1][0]), int(lua[-1][1]), 0
    return None


def tests_section(out):
    lines = ["## Tests", "", "| binary | exit | passed | failed | skipped | skip reasons |",
             "|---|---|---|---|---|---|"]
    failures = []
    for rc_path in sorted(glob.glob(os.path.join(out, "tests", "*.rc"))):
        name = os.path.basename(rc_path)[:-3]
        rc = open(rc_path).read().strip()
        passed = failed = skipped = 0
        reasons = set()
        try:
            data = json.load(open(os.path.join(out, "tests", name + ".json")))
            for suite in data.get("testsuites", []):
                for t in suite.get("testsuite", []):
                    if t.get("result") == "SKIPPED" or t.get("status") == "NOTRUN":
                        skipped += 1
                    elif t.get("failures"):
                        failed += 1
                        failures.append("%s.%s: %s" % (suite["name"], t["name"],
                                                       t["failures"][0]["failure"][:400]))
                    else:
                        passed += 1
        except (OSError, ValueError):
            counts = harness_counts(os.path.join(out, "tests", name + ".log"))
            if counts is None:
                reasons.add("no JSON (crashed or did not start; see %s.log)" % name)
            else:
                passed, failed, skipped = counts
        # GoogleTest's JSON has no skip messages: the log has "file:line: Skipped"
        # followed by the message.
        try:
            log = open(os.path.join(out, "tests", name + ".log")).read().splitlines()
            for i, line in enumerate(log[:-1]):
                if line.endswith(": Skipped"):
                    reasons.add(log[i + 1].strip()[:80])
        except OSError:
            pass
        lines.append("| %s | %s | %d | %d | %d | %s |" % (name, rc, passed, failed, skipped,
                                                         "; ".join(sorted(reasons))))
    if failures:
        lines += ["", "### Failures", ""] + ["- " + f for f in failures]
    return lines


# Dense (no sparsity) datasheet peaks in TFLOP/s: (f32 on CUDA cores,
# bf16/f16 on tensor cores with f32 accumulation). Sources: NVIDIA H100
# datasheet (SXM5: 67 / 989.4; PCIe: 51 / 756), H200 datasheet (same SXM
# compute as H100), A100 datasheet (19.5 / 312).
PEAKS = [("H100 PCIe", 51.0, 756.0), ("H100", 67.0, 989.4), ("H200", 67.0, 989.4),
         ("A100", 19.5, 312.0)]


def peak_for(env, label):
    for name, f32, tensor in PEAKS:
        if name in env:
            return f32 if label == "f32" else tensor
    return None


def bench_section(out, env=""):
    lines = ["## Benchmarks", ""]
    for rc_path in sorted(glob.glob(os.path.join(out, "bench", "*.rc"))):
        name = os.path.basename(rc_path)[:-3]
        rc = open(rc_path).read().strip()
        lines.append("### %s (exit %s)" % (name, rc))
        lines.append("")
        try:
            data = json.load(open(os.path.join(out, "bench", name + ".json")))
        except (OSError, ValueError):
            lines += ["no JSON output; see bench/%s.log" % name, ""]
            continue
        rows = data.get("benchmarks", [])
        keys = []
        for b in rows:
            for k, v in b.items():
                if isinstance(v, (int, float)) and k not in keys and k not in (
                        "family_index", "per_family_instance_index", "repetitions",
                        "repetition_index", "threads", "iterations"):
                    keys.append(k)
        with_peak = "TFLOP/s" in keys
        lines.append("| benchmark | " + " | ".join(keys) + (" | of peak |" if with_peak else " |"))
        lines.append("|---|" + "---|" * (len(keys) + (1 if with_peak else 0)))
        for b in rows:
            cells = []
            for k in keys:
                v = b.get(k)
                cells.append("" if v is None else ("%.4g" % v if isinstance(v, float) else str(v)))
            if with_peak:
                peak = peak_for(env, b.get("label", ""))
                tf = b.get("TFLOP/s")
                cells.append("%.1f%%" % (100.0 * tf / peak) if peak and tf else "")
            msg = b.get("error_message") or b.get("skip_message") or ""
            lines.append("| %s%s | %s |" % (b.get("name", "?"), (" (" + msg + ")") if msg else "",
                                           " | ".join(cells)))
        lines.append("")
    return lines


def sim_section(out):
    """The markdown calibrate and sim_validate wrote, with their exit codes."""
    lines = []
    for name in ("calibrate", "sim_validate"):
        rc_path = os.path.join(out, "sim", name + ".rc")
        if not os.path.exists(rc_path):
            continue
        rc = open(rc_path).read().strip()
        md = os.path.join(out, "sim", name + ".md")
        if os.path.exists(md):
            text = open(md).read().strip().splitlines()
            # One level down: the programs' titles become sections here.
            lines += [("#" + l if l.startswith("#") else l) for l in text]
            lines += ["", "(exit %s; log: sim/%s.log)" % (rc, name), ""]
        else:
            lines += ["## %s (exit %s)" % (name, rc), "", "no report; see sim/%s.log" % name, ""]
    return lines


def main():
    out = sys.argv[1]
    env = open(os.path.join(out, "environment.txt")).read() if os.path.exists(
        os.path.join(out, "environment.txt")) else ""
    lines = ["# shardkit GPU suite report", "", "```", env.strip(), "```", ""]
    lines += tests_section(out) + [""] + bench_section(out, env) + sim_section(out)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

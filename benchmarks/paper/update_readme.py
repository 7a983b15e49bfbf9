#!/usr/bin/python3
"""Puts a paper run's results into the checkout: the README's results block and benchmarks/results/.

    python3 benchmarks/paper/update_readme.py OUT_DIR [--readme README.md] [--results benchmarks/results]
                                                [--no_copy]

OUT_DIR is a //benchmarks:paper output folder. Its readme_results.md (written
by the run) replaces what lies between the README's markers

    <!-- results:begin -->
    <!-- results:end -->

and nothing else in the README changes; running it twice gives the same
README. Unless --no_copy, the run's tables, Markdown and plots (*.csv, *.md,
*.png; not the JSON copies of the tables, not the traces) are copied into
--results first. `./bazelw run -c opt //benchmarks:paper -- --publish` runs
this after the run.

Exit status: 0 on success, 2 on bad usage or input (missing markers, a marker
twice, no readme_results.md), with a message naming what was wrong; the README
is not touched then.
"""
import argparse
import glob
import os
import shutil
import sys

BEGIN = "<!-- results:begin -->"
END = "<!-- results:end -->"


class BlockError(ValueError):
    pass


def replace_block(text, block):
    """`text` with the lines between BEGIN and END replaced by `block`.

    The markers stay on their own lines; `block` is stripped of surrounding
    blank lines and framed by one blank line on each side. Raises BlockError
    naming the problem when a marker is missing, repeated or out of order.
    """
    for marker in (BEGIN, END):
        count = text.count(marker)
        if count != 1:
            raise BlockError("%s appears %d times in the README (needs exactly once)" % (marker, count))
    begin = text.index(BEGIN)
    end = text.index(END)
    if end < begin:
        raise BlockError("%s comes before %s" % (END, BEGIN))
    head = text[: begin + len(BEGIN)]
    tail = text[end:]
    return head + "\n\n" + block.strip("\n") + "\n\n" + tail


def copy_results(out_dir, results_dir):
    copied = []
    os.makedirs(results_dir, exist_ok=True)
    for pattern in ("*.csv", "*.md", "*.png"):
        for path in sorted(glob.glob(os.path.join(out_dir, pattern))):
            name = os.path.basename(path)
            if name == "readme_results.md":
                continue
            shutil.copyfile(path, os.path.join(results_dir, name))
            copied.append(name)
    return copied


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--readme", default="README.md")
    ap.add_argument("--results", default=os.path.join("benchmarks", "results"))
    ap.add_argument("--no_copy", action="store_true")
    args = ap.parse_args(argv[1:])
    source = os.path.join(args.out_dir, "readme_results.md")
    if not os.path.isfile(source):
        print("update_readme.py: %s not found (is %s a //benchmarks:paper output folder?)" % (source, args.out_dir),
              file=sys.stderr)
        return 2
    with open(source) as f:
        block = f.read()
    if BEGIN in block or END in block:
        print("update_readme.py: %s holds a results marker itself" % source, file=sys.stderr)
        return 2
    try:
        with open(args.readme) as f:
            text = f.read()
    except OSError as e:
        print("update_readme.py: cannot read %s: %s" % (args.readme, e), file=sys.stderr)
        return 2
    try:
        updated = replace_block(text, block)
    except BlockError as e:
        print("update_readme.py: %s: %s" % (args.readme, e), file=sys.stderr)
        return 2
    if not args.no_copy:
        copied = copy_results(args.out_dir, args.results)
        print("update_readme.py: copied %d files into %s" % (len(copied), args.results))
    if updated != text:
        with open(args.readme, "w") as f:
            f.write(updated)
        print("update_readme.py: rewrote the results block of %s" % args.readme)
    else:
        print("update_readme.py: %s already up to date" % args.readme)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

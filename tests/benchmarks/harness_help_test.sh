#!/usr/bin/env bash
# The paper harness's --help (README: "--help for the rest") lists its own
# flags under its usage line, not the ~40 glog logging flags linked into it;
# --helpfull still lists those.
set -euo pipefail
paper="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
set +e
"$paper" --help > "$tmp/help.txt" 2>&1
"$paper" --helpfull > "$tmp/full.txt" 2>&1
set -e
for flag in quick out reps world steps publish; do
  grep -q -- "^    -$flag (" "$tmp/help.txt" || { cat "$tmp/help.txt"; echo "FAIL: --help lacks --$flag" >&2; exit 1; }
done
grep -q "^paper: reproduces the PyTorch FSDP paper" "$tmp/help.txt" || { echo "FAIL: no usage line" >&2; exit 1; }
if grep -q "alsologtoemail" "$tmp/help.txt"; then echo "FAIL: --help lists glog's flags" >&2; exit 1; fi
grep -q "alsologtoemail" "$tmp/full.txt" || { echo "FAIL: --helpfull lost glog's flags" >&2; exit 1; }
grep -q -- "^    -quick (" "$tmp/full.txt" || { echo "FAIL: --helpfull lacks --quick" >&2; exit 1; }
echo PASS

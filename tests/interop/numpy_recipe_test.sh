#!/usr/bin/env bash
# Writes shardkit files (a trained gpt-tiny: full state dict and hf-gpt2
# export), converts hf-gpt2 -> shardkit -> hf-gpt2 with //tools:convert, then
# checks them with Python's standard library and numpy (Debian's python3 and
# python3-numpy, which bazelw installs): numpy_recipe_test.py says what.
#   numpy_recipe_test.sh WRITER CONVERT SCRIPT DOC
set -euo pipefail
writer="$1" convert="$2" script="$3" doc="$4"
dir="${TEST_TMPDIR:-$(mktemp -d)}/interop"
rm -rf "$dir" && mkdir -p "$dir"
"$writer" "$dir"
"$convert" --from=hf-gpt2 "$dir/hf-gpt2.safetensors" "$dir/back-to-shardkit.safetensors"
"$convert" --to=hf-gpt2 "$dir/back-to-shardkit.safetensors" "$dir/round-trip.safetensors"
# Optimizer state needs --weights_only to leave the shardkit layout.
if "$convert" --to=torch "$dir/shardkit.safetensors" "$dir/torch.safetensors" 2>"$dir/err"; then
  echo "FAIL: converting optimizer state without --weights_only succeeded" >&2
  exit 1
fi
grep -q "optimizer" "$dir/err" || { cat "$dir/err" >&2; exit 1; }
"$convert" --to=torch --weights_only "$dir/shardkit.safetensors" "$dir/torch.safetensors"
# Debian's interpreter (numpy comes from the archive, not pip).
exec /usr/bin/python3 "$script" "$doc" "$dir"

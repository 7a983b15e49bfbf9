#!/usr/bin/env bash
# libshardkit.so exports exactly the functions shardkit.h declares: nothing
# that is not sk_* (no runtime, no libstdc++ instantiations), and every
# declared function is really there.
set -euo pipefail
lib="$1"
header="$2"

exported=$(nm -D --defined-only "$lib" | awk '{print $3}' | sed 's/@.*//' | sort -u)
if [[ -z "$exported" ]]; then
  echo "FAIL: $lib exports nothing" >&2
  exit 1
fi
bad=$(grep -v '^sk_' <<<"$exported" || true)
if [[ -n "$bad" ]]; then
  echo "FAIL: $lib exports symbols outside the C ABI:" >&2
  echo "$bad" | head -50 >&2
  exit 1
fi

# Declared functions: "SK_EXPORT ... sk_name(" in the header.
declared=$(tr '\n' ' ' <"$header" | grep -o 'SK_EXPORT[^;]*' | grep -o 'sk_[a-z0-9_]*(' |
           tr -d '(' | sort -u)
missing=$(comm -23 <(echo "$declared") <(echo "$exported"))
extra=$(comm -13 <(echo "$declared") <(echo "$exported"))
if [[ -n "$missing" ]]; then
  echo "FAIL: declared in shardkit.h but not exported:" >&2
  echo "$missing" >&2
  exit 1
fi
if [[ -n "$extra" ]]; then
  echo "FAIL: exported but not declared in shardkit.h:" >&2
  echo "$extra" >&2
  exit 1
fi
echo "PASS: $(wc -l <<<"$exported") sk_* symbols, all declared, nothing else exported"

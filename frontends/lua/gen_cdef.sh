#!/usr/bin/env bash
# Generates the LuaJIT ffi.cdef text from shardkit.h (never hand-copied):
# keeps the declarations, drops every preprocessor line, drops the contents
# of every conditional block except the include guard (extern "C", the
# attribute macros and the layout asserts live in such blocks), and removes
# the SK_EXPORT / SK_NODISCARD attribute macros.
#   gen_cdef.sh shardkit.h > shardkit_cdef.lua
set -euo pipefail
header="$1"
echo "-- GENERATED from shardkit.h by frontends/lua/gen_cdef.sh: do not edit."
echo "return [["
awk '
  BEGIN { depth = 0; skip = 0; cont = 0 }
  cont { cont = ($0 ~ /\\$/); next }
  /^[ \t]*#/ {
    cont = ($0 ~ /\\$/)
    if ($0 ~ /^[ \t]*#[ \t]*if/) {
      depth++
      guard = ($0 ~ /^[ \t]*#[ \t]*ifndef[ \t]+SHARDKIT_SHARDKIT_H_/)
      skipping[depth] = guard ? 0 : 1
      if (!guard) skip++
    } else if ($0 ~ /^[ \t]*#[ \t]*endif/) {
      if (skipping[depth]) skip--
      depth--
    }
    next
  }
  skip == 0 {
    gsub(/SK_EXPORT[ \t]+/, "")
    gsub(/SK_NODISCARD[ \t]+/, "")
    print
  }
' "$header" | sed -E 's/SK_ENUM\(([A-Za-z0-9_]+)\)/enum \1/'
echo "]]"

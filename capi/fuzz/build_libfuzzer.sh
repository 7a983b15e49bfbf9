#!/usr/bin/env bash
# Builds the fuzz entry (fuzz_entry_points.cc) as a real libFuzzer target:
# clang with -fsanitize=fuzzer,address, with the C ABI and every runtime
# source it is made of compiled with coverage instrumentation. (Bazel's
# toolchain is gcc, which has no libFuzzer; the Bazel test runs the same
# entry under the standalone driver capi:fuzz_replay instead.)
#   capi/fuzz/build_libfuzzer.sh [OUT_DIR]      (default /tmp/shardkit-fuzz)
#   OUT_DIR/fuzz_entry_points -max_total_time=60 OUT_DIR/corpus capi/fuzz/corpus
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-/tmp/shardkit-fuzz}"
mkdir -p "$out/obj" "$out/corpus"
command -v clang++ >/dev/null || { echo "clang++ not found (apt-get install clang)" >&2; exit 1; }

# The sources libshardkit.so is made of in this configuration (cquery
# resolves the CUDA selects), as Bazel knows them.
mapfile -t srcs < <(bazel cquery 'kind("source file", deps(//capi:libshardkit.so))' 2>/dev/null |
                    sed 's| (.*)$||' | grep -E '^//(runtime|capi)[/:].*\.cc$' | sed 's|^//||; s|:|/|')
# Sources a genrule writes (the compiled-in simulator profiles), built here
# and compiled from bazel-bin.
mapfile -t gens < <(bazel cquery 'kind("genrule", deps(//capi:libshardkit.so))' 2>/dev/null |
                    sed 's| (.*)$||' | grep -E '^//(runtime|capi)[/:]')
if ((${#gens[@]})); then
  bazel build "${gens[@]}" >/dev/null 2>&1
  for g in "${gens[@]}"; do
    while read -r o; do
      [[ "$o" == *.cc ]] && srcs+=("bazel-bin/$(sed 's|^//||; s|:|/|' <<<"$o")")
    done < <(bazel query --output=build "$g" 2>/dev/null | sed -n 's/.*outs = \[\(.*\)\].*/\1/p' |
             tr -d '" ' | tr ',' '\n')
  done
fi
flags=(-std=c++20 -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address -fPIC
       -I. -Icapi/include)
# An object is rebuilt when its source or any header or .inc is newer
# (coarse: the script does not track which headers a source includes).
newest_header="$(ls -t $(find runtime capi -name '*.h' -o -name '*.inc') | head -1)"
objs=()
for src in "${srcs[@]}"; do
  obj="$out/obj/$(tr / _ <<<"$src").o"
  objs+=("$obj")
  if [[ ! "$obj" -nt "$src" || ! "$obj" -nt "$newest_header" ]]; then
    while (($(jobs -rp | wc -l) >= $(nproc))); do wait -n; done
    clang++ "${flags[@]}" -c "$src" -o "$obj" &
  fi
done
wait
clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address -Icapi/include \
  capi/fuzz/fuzz_entry_points.cc "${objs[@]}" \
  -L/usr/lib -lgloo -lglog -lgflags -lxsmm -lopenblas -ldnnl -lz -lgomp -lpthread \
  -o "$out/fuzz_entry_points"
echo "built $out/fuzz_entry_points from ${#srcs[@]} sources"

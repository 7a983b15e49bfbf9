#!/usr/bin/env bash
# Replays the fuzz corpus and 400 random inputs through every parsing entry
# point of the C ABI; any crash or sanitizer report fails the test.
set -euo pipefail
"$1" --random=400 --seed=20261122 "$2"

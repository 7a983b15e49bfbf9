#!/bin/bash
# Runs update_readme_test.py against benchmarks/paper/update_readme.py with
# Debian's python3 (standard library only).
set -euo pipefail
exec /usr/bin/python3 "$1" "$2"

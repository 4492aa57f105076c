#!/usr/bin/env bash
# The README's two commands as a new user runs them, timed: clone this repository into a
# temporary folder, then
#   1. python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/python train.py
#   2. python3 -m venv .venv && .venv/bin/pip install -e ".[dev]" && .venv/bin/python -m pytest --slow
# Prints each step's wall time, the environment's size on disk, train.py's test/acc and pytest's
# summary line. pip's download cache is whatever this machine has (say which when you quote it).
#   bash benchmarks/fresh_clone.sh
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
folder="$(mktemp -d)"
trap 'rm -rf "$folder"' EXIT
git clone -q "$repo" "$folder/kindling"
cd "$folder/kindling"

timed() {  # timed <label> <command...>: run it, print "<label>: <seconds> s"
    local label="$1" start=$SECONDS status=0
    shift
    "$@" || status=$?
    echo "$label: $((SECONDS - start)) s" >&2
    return "$status"
}

timed "1. install (pip install -e .)" bash -c 'python3 -m venv .venv && .venv/bin/pip install -q -e . >/dev/null'
echo "environment on disk after command 1: $(du -sh .venv | cut -f1)" >&2
timed "1. python train.py" bash -c '.venv/bin/python train.py > train.log 2>&1'
grep -Eo "test/acc[^0-9]*[0-9.]+" train.log | tail -1 >&2
timed "2. install (pip install -e \".[dev]\")" bash -c 'python3 -m venv .venv && .venv/bin/pip install -q -e ".[dev]" >/dev/null'
echo "environment on disk after command 2: $(du -sh .venv | cut -f1)" >&2
status=0
timed "2. python -m pytest --slow" bash -c '.venv/bin/python -m pytest --slow -q -rfE > pytest.log 2>&1' || status=$?
grep -E "^(FAILED|ERROR) " pytest.log >&2 || true
tail -1 pytest.log >&2
echo "pytest exit status: $status" >&2
exit "$status"

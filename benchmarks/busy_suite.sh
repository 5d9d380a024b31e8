#!/usr/bin/env bash
# The default test suite on a busy machine: two CPU-bound processes beside it for the whole run.
# Usage (from a clone whose .venv has privmtl[test] installed): bash benchmarks/busy_suite.sh LOG
# The log ends with pytest's 15 slowest durations and "rc=<exit status> wall=<seconds>"; compare each
# slow test with its own timeouts (the subprocess timeouts in tests/: grep "timeout=").
log=${1:-busy_suite.log}
python3 -c "while True: pass" & b1=$!
python3 -c "while True: pass" & b2=$!
trap 'kill $b1 $b2 2>/dev/null' EXIT
start=$(date +%s)
PRIVMTL_CACHE_DIR=$(mktemp -d) .venv/bin/python -m pytest -q -p no:cacheprovider --durations=15 > "$log" 2>&1
echo "rc=$? wall=$(( $(date +%s) - start ))s" >> "$log"

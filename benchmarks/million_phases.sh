#!/usr/bin/env bash
# The population-scale m-client run without the end of run, one thread, its phases and peak memory:
#   benchmarks/million_phases.sh M OUT_PREFIX [PYTHONPATH of another checkout's src]
# writes OUT_PREFIX.json (the run's JSON) and OUT_PREFIX.time (/usr/bin/time -v).
set -euo pipefail
m=$1 out=$2
export OMP_NUM_THREADS=1
if [ $# -ge 3 ]; then export PYTHONPATH=$3; fi
/usr/bin/time -v -o "$out.time" .venv/bin/python -c \
  "import sys; from privmtl.cli import main; sys.argv = ['privmtl', *sys.argv[1:]]; main()" \
  pmtl --data synthetic --num-clients "$m" --model logreg --clients-per-round 200 --rounds 200 \
  --epsilon 1 --finetune none --threads 1 --json > "$out.json"
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print({k: round(v, 1) for k, v in d['phases'].items()}, 'seconds', round(d['seconds'], 1), 'test', d['test_accuracy'], 'mean', d['mean_client_accuracy'])" "$out.json"
grep -E "Maximum resident|Elapsed|User time|System time" "$out.time"

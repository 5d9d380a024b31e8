#!/usr/bin/env bash
# What a run's local baseline costs at a large population: one seeded-data, secure-noise run at
# m clients whose JSON says the baseline's own seconds (baseline_seconds) beside the run's.
# Usage: bash benchmarks/baseline_cost.sh OUT_DIR [M]   (M defaults to 100000)
set -euo pipefail
out="${1:?usage: baseline_cost.sh OUT_DIR [M]}"
m="${2:-100000}"
mkdir -p "$out"
/usr/bin/time -v privmtl pmtl --data synthetic --num-clients "$m" --model logreg \
  --clients-per-round 200 --rounds 50 --epsilon 1 --seed 0 --json \
  > "$out/baseline_cost_$m.json" 2> "$out/baseline_cost_$m.time"
python3 - "$out/baseline_cost_$m.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(f"m={d['num_clients']} seconds={d['seconds']:.1f} baseline_seconds={d['baseline_seconds']:.2f} "
      f"share={d['baseline_seconds'] / d['seconds']:.2%} baseline_clients={d['baseline_clients']} "
      f"test={d['test_accuracy']:.4f} local={d['local_test_accuracy']:.4f} "
      f"gain={d['gain_over_local']:+.4f} {d['gain_interval']}")
PY

#!/usr/bin/env bash
# Paired marginal seconds per Flower round, (wall(8) - wall(3)) / 5, per source tree (PYTHONPATH).
# Usage: bash benchmarks/flower_marginal.sh OUT REPS SRC [SRC ...]  (each SRC a privmtl source tree, e.g. src)
# Every process of the run (SuperLink, SuperNodes, ClientApps, ServerApp) imports privmtl from SRC.
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONUNBUFFERED=1
out=$1; reps=$2; shift 2; trees=($(for t in "$@"; do realpath "$t"; done))
BIN=${BIN:-$(pwd)/.venv/bin}
export PATH="$BIN:$PATH"
out=$(realpath -m "$out"); : > $out
d=$(mktemp -d); cd $d
for rep in $(seq 0 $((reps-1))); do
  if [ $((rep % 2)) = 0 ]; then order=("${trees[@]}"); lens="3 8"; else order=($(printf '%s\n' "${trees[@]}" | tac)); lens="8 3"; fi
  for t in "${order[@]}"; do
    for r in $lens; do
      export XDG_STATE_HOME=$(mktemp -d)
      s=$(date +%s.%N)
      PYTHONPATH=$t $BIN/privmtl flower local --num-supernodes 3 --data synthetic --model logreg --clients-per-round 6 --epsilon 2 --seed 0 --reproducible-noise --json --rounds $r > r.json 2> err.txt
      rc=$?; e=$(date +%s.%N)
      spr=$(python3 -c "import json;print(round(json.loads(open('r.json').read().strip().splitlines()[-1])['seconds_per_round'],3))" 2>/dev/null)
      echo "$rep ${t//\//_} R=$r rc=$rc wall=$(python3 -c "print(round($e-$s,2))") spr=$spr load=$(cut -d' ' -f1 /proc/loadavg)" >> $out
      rm -rf $XDG_STATE_HOME
    done
  done
done
echo done >> $out

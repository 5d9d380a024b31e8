#!/bin/bash
# The CNN's end of run on FEMNIST-105 (results: benchmarks/results/end_of_run_cnn.md).
#   bash benchmarks/end_of_run_cnn.sh OUT SEED...
# For each seed: (1) every writer's local training by epoch count, SGD at 0.1 and 0.03 to 100
# epochs (the grid before) and Adam at 0.003 to 20, one process per step size; (2) PMTL's trained
# models (--finetune none --threads 1 --save-models) and their per-writer scores; (3) the two default commands,
# timed alone (/usr/bin/time -v). Then: python benchmarks/cnn_local_choice.py OUT/*.jsonl
set -euo pipefail
out=$1; shift
mkdir -p "$out"
E="1 2 3 4 5 6 8 10 12 15 20 25 30 40 50 70 100"
for s in "$@"; do
  OMP_NUM_THREADS=1 python benchmarks/cnn_local_epochs.py --seed "$s" --lr 0.1 --epochs $E --out "$out/sgd_s$s.jsonl" &
  OMP_NUM_THREADS=1 python benchmarks/cnn_local_epochs.py --seed "$s" --lr 0.03 --epochs $E --out "$out/sgd_s$s.jsonl" &
  wait
  OMP_NUM_THREADS=1 python benchmarks/cnn_local_epochs.py --seed "$s" --solver adam --lr 0.003 --epochs 2 4 6 8 10 12 15 20 --out "$out/adam_s$s.jsonl"
  privmtl pmtl --data femnist-leaf --model cnn --epsilon 1 --seed "$s" --finetune none --threads 1 --save-models "$out/trained_s$s" --overwrite --json > "$out/trained_s$s.json"
  python benchmarks/cnn_trained_scores.py --seed "$s" --models "$out/trained_s$s" --out "$out/trained.jsonl"
  /usr/bin/time -v privmtl pmtl --data femnist-leaf --model cnn --epsilon 1 --seed "$s" --json > "$out/pmtl_s$s.json" 2> "$out/pmtl_s$s.time"
  /usr/bin/time -v privmtl pmtl --data femnist-leaf --model cnn --method local-all --seed "$s" --json > "$out/local_s$s.json" 2> "$out/local_s$s.time"
done

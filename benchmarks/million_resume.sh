#!/usr/bin/env bash
# Kill and --resume at scale: the population-scale command, seeded (--reproducible-noise), with a checkpoint,
# run twice side by side: once uninterrupted, once killed (SIGKILL) after KILL_AFTER_S seconds and
# resumed from its checkpoint. The two JSON answers must agree on every key but the timings and the
# checkpoint directory, and the two write-ahead ledgers must be the same bytes.
#   benchmarks/million_resume.sh M KILL_AFTER_S OUT_PREFIX
# writes OUT_PREFIX.{u,k,r}.{json,err} (uninterrupted, killed, resumed) and OUT_PREFIX.{u,k}dir.
set -uo pipefail
m=$1 kill_after=$2 out=$3
cmd=(.venv/bin/privmtl pmtl --data synthetic --num-clients "$m" --model logreg
     --clients-per-round 200 --rounds 200 --epsilon 1 --reproducible-noise --seed 0 --json)
rm -rf "$out.udir" "$out.kdir"
(/usr/bin/time -v "${cmd[@]}" --checkpoint-dir "$out.udir" > "$out.u.json" 2> "$out.u.err") &
uninterrupted=$!
"${cmd[@]}" --checkpoint-dir "$out.kdir" > "$out.k.json" 2> "$out.k.err" &
killed=$!
sleep "$kill_after"
kill -9 "$killed"
wait "$killed"
echo "killed after ${kill_after} s; releases in its ledger: $(($(wc -l < "$out.kdir/ledger.jsonl") - 1))"
/usr/bin/time -v "${cmd[@]}" --checkpoint-dir "$out.kdir" --resume > "$out.r.json" 2> "$out.r.err"
wait "$uninterrupted"
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
u, r = (json.load(open(f"{out}.{x}.json")) for x in "ur")
timing = {"seconds", "seconds_per_round", "data_seconds", "phases", "checkpoint_dir"}
differ = sorted(k for k in set(u) | set(r) if k not in timing and u.get(k) != r.get(k))
print("keys that differ (timings aside):", differ or "none")
print("test accuracy", u["test_accuracy"], r["test_accuracy"], "epsilon", u["epsilon"], r["epsilon"])
PY
cmp "$out.udir/ledger.jsonl" "$out.kdir/ledger.jsonl" && echo "ledgers: the same bytes"
sha256sum "$out.udir/ledger.jsonl" "$out.kdir/ledger.jsonl"

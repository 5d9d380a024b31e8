#!/usr/bin/env bash
# The end of run at torch's default threads: seeded JSON and times of two installs, paired.
#   OLD=/path/to/old/venv/bin/privmtl NEW=/path/to/new/venv/bin/privmtl bash benchmarks/end_of_run_threads.sh [M ...]
# Prints, per population size M, whether the seeded JSON (timings removed) is identical and the
# wall / user CPU seconds and the end_of_run phase of each. No OMP_NUM_THREADS: the defaults.
set -u
OLD=${OLD:?set OLD to the privmtl of the tree before}
NEW=${NEW:?set NEW to the privmtl of the tree after}
d=$(mktemp -d)
cd "$d"
for m in "${@:-800 2000}"; do
  for arm in old new; do
    if [ $arm = old ]; then bin=$OLD; else bin=$NEW; fi
    /usr/bin/time -f "%e %U" -o $arm$m.time "$bin" pmtl --data synthetic --num-clients "$m" \
      --model logreg --clients-per-round 100 --rounds 5 --epsilon 1 --reproducible-noise --json \
      > $arm$m.json 2> $arm$m.err
  done
  python3 - "$m" <<'PY'
import json, sys
t = sys.argv[1]
def load(a):
    r = json.loads(open(f"{a}{t}.json").read().strip().splitlines()[-1])
    ph = r.get("phases")
    for k in ("seconds", "phases", "data_seconds", "train_seconds", "cpu_seconds", "history",
              "seconds_per_round"):
        r.pop(k, None)
    return r, ph, open(f"{a}{t}.time").read().split()
(a, pa, ta), (b, pb, tb) = load("old"), load("new")
diff = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
print(f"m={t}: seeded JSON {'identical' if not diff else 'differs in ' + str(diff)}")
print(f"  old wall {ta[0]} s, user {ta[1]} s, end_of_run {pa['end_of_run']:.1f} s")
print(f"  new wall {tb[0]} s, user {tb[1]} s, end_of_run {pb['end_of_run']:.1f} s")
PY
done
rm -rf "$d"

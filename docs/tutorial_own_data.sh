#!/usr/bin/env bash
# "Your own model and table" (docs/tutorial_own_data.md), as a user runs it: from an EMPTY directory
# outside the repository, with privmtl installed and no PYTHONPATH. CI runs this script
# (.ci/run and tests/cli/test_tutorial_own_data.py); every step must exit as the tutorial says.
#
#   mkdir /tmp/try-privmtl && cd /tmp/try-privmtl && bash /path/to/docs/tutorial_own_data.sh
#
# PRIVMTL overrides the command (default: privmtl), e.g. PRIVMTL="python -m privmtl".
set -euo pipefail
PRIVMTL=${PRIVMTL:-privmtl}
PYTHON=${PYTHON:-python3}
if [ -n "$(ls -A .)" ]; then
  echo "run this tutorial in an empty directory; $(pwd) is not empty" >&2
  exit 1
fi

echo "== 1. your model: a factory FACTORY(n_features, n_classes) -> torch.nn.Module"
cat > mymodels.py <<'EOF'
from torch import nn


def make_mlp(n_features, n_classes):
    """A small MLP: (batch, n_features) floats -> (batch, n_classes) logits."""
    return nn.Sequential(nn.Linear(n_features, 32), nn.ReLU(), nn.Linear(32, n_classes))


def make_wrong(n_features, n_classes):
    """A mistake: three logits too many."""
    return nn.Linear(n_features, n_classes + 3)
EOF

echo "== 2. your tables (made up here; use your own CSV or Parquet files)"
"$PYTHON" - <<'EOF'
import numpy as np
import pandas as pd

rng = np.random.default_rng(0)
# clients.csv: one row per example; 12 hospitals; features on very different scales
centers = rng.normal(size=(3, 4)) * 1.5
rows = []
for k in range(12):
    y = rng.integers(0, 3, size=60)
    x = (centers[y] + rng.normal(size=(60, 4))) * [0.001, 1.0, 50.0, 1000.0]
    frame = pd.DataFrame(x, columns=["age_years", "dose", "weight_g", "income"])
    frame.insert(0, "hospital", f"h{k:02d}")
    frame["diagnosis"] = y
    rows.append(frame)
pd.concat(rows).to_csv("clients.csv", index=False)

# sites.csv: one regression task per site, the target called "outcome"
basis = rng.normal(size=(5, 2))
rows = []
for t in range(10):
    z = rng.normal(size=(80, 5))
    y = z @ (basis @ rng.normal(size=2)) + 3.0 + 0.3 * rng.normal(size=80)
    frame = pd.DataFrame(z * [0.01, 1, 10, 100, 1000], columns=[f"m{j}" for j in range(5)])
    frame.insert(0, "site", f"s{t}")
    frame["outcome"] = y
    rows.append(frame)
pd.concat(rows).to_csv("sites.csv", index=False)
EOF
head -3 clients.csv

echo "== 3. PMTL on clients.csv with your model (module in the working directory)"
$PRIVMTL pmtl --data table --data-path clients.csv --client-column hospital \
  --label-column diagnosis --model mymodels:make_mlp --epsilon 4 --rounds 20 \
  --save-models out1 --json > run1.json
"$PYTHON" -c "import json; r = json.load(open('run1.json')); print('test accuracy', round(r['test_accuracy'], 3), '| clients per round', r['clients_per_round'], '| scaling:', r['scaling'], '|', r['summary'])"

echo "== 4. the same model given as a file"
$PRIVMTL pmtl --data table --data-path clients.csv --client-column hospital \
  --label-column diagnosis --model ./mymodels.py:make_mlp --epsilon 4 --rounds 20 \
  --save-models out2 --json > run2.json

echo "== 5. score the saved models again, from another directory"
OUT1="$(pwd)/out1"
(cd / && $PRIVMTL evaluate "$OUT1" --json) > eval1.json
"$PYTHON" -c "import json; a, b = json.load(open('run1.json')), json.load(open('eval1.json')); assert a['test_accuracy'] == b['test_accuracy'], (a['test_accuracy'], b['test_accuracy']); print('evaluate from /: test accuracy', round(b['test_accuracy'], 3))"

echo "== 6. MP-MTL on sites.csv, with its own column names, then evaluate from /"
$PRIVMTL mpmtl --data table --data-path sites.csv --task-column site --target-column outcome \
  --method lowrank --epsilon 1 --save-models mp1 --json > mp1.json
MP1="$(pwd)/mp1"
(cd / && $PRIVMTL evaluate "$MP1" --json) > eval_mp1.json
"$PYTHON" -c "import json; a, b = json.load(open('mp1.json')), json.load(open('eval_mp1.json')); assert a['nmse'] == b['nmse']; print('nMSE', round(a['nmse'], 4), '| scaling', a['scaling'], '| train fraction', a['train_fraction'], '| evaluate from /:', round(b['nmse'], 4))"

echo "== 7. a factory whose output does not fit is refused before training"
set +e
$PRIVMTL pmtl --data table --data-path clients.csv --client-column hospital \
  --label-column diagnosis --model mymodels:make_wrong --rounds 20 > wrong.out 2> wrong.err
code=$?
set -e
cat wrong.err
if [ "$code" -ne 2 ] || [ "$(wc -l < wrong.err)" -ne 1 ] || ! grep -q -- "--model" wrong.err; then
  echo "expected exit 2 and one stderr line naming --model; got exit $code" >&2
  exit 1
fi
echo "== 8. the same seeded run on Flower (3 SuperNodes on this machine), where Flower is installed"
if "$PYTHON" -c "import flwr" 2> /dev/null; then
  SEEDED=(--data table --data-path clients.csv --client-column hospital --label-column diagnosis
          --model mymodels:make_mlp --epsilon 4 --rounds 5 --reproducible-noise --json)
  $PRIVMTL pmtl "${SEEDED[@]}" > seeded.json
  $PRIVMTL flower local --num-supernodes 3 --work-dir flower-run "${SEEDED[@]}" > flower.json
  "$PYTHON" -c "import json; a, b = json.load(open('seeded.json')), json.load(open('flower.json')); assert abs(a['epsilon'] - b['epsilon']) < 1e-9 and abs(a['test_accuracy'] - b['test_accuracy']) < 1e-9, (a['epsilon'], b['epsilon'], a['test_accuracy'], b['test_accuracy']); print('Flower = in process: epsilon', round(b['epsilon'], 4), '| test accuracy', round(b['test_accuracy'], 3))"
else
  echo "Flower is not installed (pip install 'privmtl[flower]'): step skipped"
fi
echo "tutorial: all steps ran as documented"

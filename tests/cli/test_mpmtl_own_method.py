"""``privmtl mpmtl --method FILE.py:NAME``: a user's linear method, loaded only when named, its
file's SHA-256 recorded in the result and the saved model."""

from __future__ import annotations

import hashlib
import json
import textwrap

from privmtl.cli import main

OWN = textwrap.dedent(
    """
    from privmtl.linear import STLRidge
    from privmtl.linear.methods import LinearMethod

    class Halved(STLRidge):
        def fit(self, Xs, ys=None):
            super().fit(Xs, ys)
            self.coef_ = self.coef_ / 2
            return self

    class HalvedRidge(LinearMethod):
        name = "halved-ridge"
        estimator = Halved
        grid = [{"lam": [0.01, 1.0]}]

    def not_a_method():
        return None
    """
)


def test_an_own_method_runs_from_its_file_and_the_result_records_its_hash(
    tmp_path, capsys, monkeypatch
):
    own = tmp_path / "own.py"
    own.write_text(OWN)
    monkeypatch.chdir(tmp_path)
    models = tmp_path / "models"
    code = main(["mpmtl", "--data", "synthetic-lowrank", "--method", "own.py:HalvedRidge",
                 "--json", "--save-models", str(models)])  # fmt: skip
    cap = capsys.readouterr()
    assert code == 0, cap.err
    out = json.loads(cap.out)
    sha = hashlib.sha256(own.read_bytes()).hexdigest()
    assert out["method"] == "halved-ridge" and out["tuned"] is True
    assert out["method_source"]["sha256"] == sha
    assert out["method_source"]["name"] == "halved-ridge"
    saved = json.loads((models / "model.json").read_text())
    assert saved["method_source"]["sha256"] == sha


def test_a_name_that_is_not_a_linear_method_is_one_line(tmp_path, capsys, monkeypatch):
    (tmp_path / "own.py").write_text(OWN)
    monkeypatch.chdir(tmp_path)
    code = main(["mpmtl", "--data", "synthetic-lowrank", "--method", "own.py:not_a_method"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.count("\n") == 0 and "LinearMethod" in err and "--method" in err
    code = main(["mpmtl", "--data", "synthetic-lowrank", "--method", "nope"])
    assert code == 2

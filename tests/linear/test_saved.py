"""Saved MP-MTL models: a folder with a model.json is complete."""

from __future__ import annotations

import numpy as np
import pytest

from privmtl.linear import saved


def test_a_save_cut_short_over_a_folder_leaves_no_model_json(tmp_path, monkeypatch):
    folder = tmp_path / "models"
    meta = {"family": "mpmtl", "method": "stl-l2"}
    saved.save_linear_models(folder, np.ones((3, 2)), meta)
    assert (folder / "model.json").exists()
    real = saved.write_atomic

    def crash(path, data):
        real(path, data)
        if path.name == "coef.npy":  # the new coefficients, before the new model.json
            raise KeyboardInterrupt

    monkeypatch.setattr(saved, "write_atomic", crash)
    with pytest.raises(KeyboardInterrupt):
        saved.save_linear_models(folder, np.zeros((3, 4)), meta)
    # never the old index (3 x 2) over the new coefficients (3 x 4)
    assert not (folder / "model.json").exists()

"""Saved MP-MTL models: a folder with a model.json is complete."""

from __future__ import annotations

import numpy as np
import pytest

from privmtl.linear import saved


def test_a_save_cut_short_over_a_folder_leaves_the_old_folder(tmp_path, monkeypatch):
    folder = tmp_path / "models"
    meta = {"family": "mpmtl", "method": "stl-l2"}
    saved.save_linear_models(folder, np.ones((3, 2)), meta)
    assert (folder / "model.json").exists()
    real = saved.sign

    def crash(doc):  # the new coefficients are written, the new model.json not yet
        real(doc)
        raise KeyboardInterrupt

    monkeypatch.setattr(saved, "sign", crash)
    with pytest.raises(KeyboardInterrupt):
        saved.save_linear_models(folder, np.zeros((3, 4)), meta)
    # the old index over the old coefficients, and no staging folder left
    _, coef = saved.load_linear_models(folder)
    assert coef.shape == (3, 2) and sorted(p.name for p in folder.iterdir()) == [
        "coef.npy",
        "model.json",
    ]


def test_a_coef_file_copied_from_another_folder_is_refused(tmp_path):
    from privmtl.exceptions import DataFormatError

    meta = {"family": "mpmtl", "method": "stl-l2"}
    saved.save_linear_models(tmp_path / "a", np.ones((3, 2)), meta)
    saved.save_linear_models(tmp_path / "b", np.full((3, 2), 5.0), meta)
    (tmp_path / "a" / "coef.npy").write_bytes((tmp_path / "b" / "coef.npy").read_bytes())
    with pytest.raises(DataFormatError, match=r"coef\.npy.*SHA-256"):
        saved.load_linear_models(tmp_path / "a")

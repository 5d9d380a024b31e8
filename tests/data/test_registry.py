"""One registry of the data sets of both families: names, options, loaders, and who reads it."""

from __future__ import annotations

import inspect
import subprocess
import sys

import click
import numpy as np
import pandas as pd
import pytest

from privmtl.data import registry
from privmtl.data.registry import (
    FAMILIES,
    REGISTRY,
    absolute_data_path,
    data_protocol,
    dataset_info,
    dataset_names,
    datasets_help,
    load_federated,
    load_mpmtl_data,
)
from privmtl.exceptions import InvalidParameterError


def _data_choices(command: click.Command) -> list[str]:
    (param,) = [p for p in command.params if p.name == "data"]
    assert isinstance(param.type, click.Choice)
    return list(param.type.choices)


def test_every_entry_is_filed_under_its_family_and_name():
    assert set(REGISTRY) == set(FAMILIES)
    for family, entries in REGISTRY.items():
        for name, info in entries.items():
            assert (info.family, info.name) == (family, name)
            assert info.description and set(info.required) <= set(info.options)


def test_every_declared_option_is_a_keyword_of_its_loader():
    for family, entries in REGISTRY.items():
        for info in entries.values():
            signature = inspect.signature(info.loader()).parameters
            if any(p.kind is p.VAR_KEYWORD for p in signature.values()):
                continue  # generators: seed only
            extra = {"seed"} | ({"scaling", "train_fraction"} if info.split else set())
            assert set(info.options) | extra == set(signature), (family, info.name)


def test_the_cli_offers_exactly_the_registered_data_sets_with_their_descriptions():
    from privmtl.cli.mpmtl import mpmtl, mpmtl_sweep
    from privmtl.cli.pmtl import pmtl, pmtl_sweep

    for family, commands in (("pmtl", (pmtl, pmtl_sweep)), ("mpmtl", (mpmtl, mpmtl_sweep))):
        for command in commands:
            assert _data_choices(command) == list(dataset_names(family))
            (param,) = [p for p in command.params if p.name == "data"]
            assert param.help == datasets_help(family)
            for info in REGISTRY[family].values():
                assert info.description in param.help


def test_flower_offers_the_data_sets_it_can_serve():
    pytest.importorskip("flwr")
    from privmtl.cli.flower import flower

    local = flower.commands["local"]
    assert isinstance(local, click.Command)
    assert _data_choices(local) == ["femnist-leaf", "synthetic", "table"]
    assert "table" in dataset_names("pmtl", flower=True)


def test_the_old_import_paths_are_the_registry_itself():
    from privmtl.experiments import mpmtl, pmtl, pmtl_sweep

    assert pmtl.load_federated is load_federated
    assert pmtl.default_femnist_dir is registry.default_femnist_dir
    assert pmtl_sweep.load_federated is load_federated
    assert pmtl.FL_DATASETS == dataset_names("pmtl")
    assert mpmtl.load_mpmtl_data is load_mpmtl_data
    assert mpmtl.data_protocol is data_protocol
    assert mpmtl.target_offsets is registry.target_offsets
    assert mpmtl.TABLE_SCALINGS is registry.MPMTL_SCALINGS
    assert mpmtl.DATASETS == dataset_names("mpmtl")


def test_an_unknown_name_or_family_is_refused_naming_the_parameter():
    with pytest.raises(InvalidParameterError, match=r"'data' parameter must be one of .*'school'"):
        dataset_info("mpmtl", "femnist-leaf")
    with pytest.raises(InvalidParameterError, match=r"'data' parameter .*got 'school'"):
        load_federated("school")
    with pytest.raises(InvalidParameterError, match=r"'family' parameter .*got 'linear'"):
        dataset_names("linear")


def test_a_missing_required_option_is_named():
    with pytest.raises(InvalidParameterError, match="data='table' needs the 'client_column'"):
        load_federated("table", data_path="t.csv", label_column="y")
    with pytest.raises(InvalidParameterError, match="'data_path' parameter is required"):
        load_mpmtl_data("table")
    with pytest.raises(InvalidParameterError, match="'num_clients' parameter applies to data="):
        load_federated("femnist-leaf", num_clients=3)


def test_the_loaders_dispatch_by_name():
    ds = load_federated("synthetic", seed=1, num_clients=4)
    assert ds.n_clients == 4
    train, test = load_mpmtl_data("synthetic-lowrank", seed=0)
    assert train.n_tasks == test.n_tasks > 1


def test_a_split_data_set_takes_its_protocol_from_its_entry(tmp_path):
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(rng.normal(size=(80, 3)) * 50 + 7, columns=["a", "b", "y"])
    frame["task"] = np.repeat(["t0", "t1"], 40)
    frame.to_csv(tmp_path / "t.csv", index=False)
    table = dataset_info("mpmtl", "table")
    assert data_protocol("table") == (table.scaling, table.train_fraction) == ("per-task", 0.7)
    assert data_protocol("table", unit_norm=True) == ("unit-norm", 0.7)
    train, _ = load_mpmtl_data("table", data_path=tmp_path / "t.csv", seed=0)
    assert train.n_samples.tolist() == [28, 28]  # 70% of each task's 40 rows
    # per-task scaling: every task's features centred on its own training rows
    for x in train.X:
        assert np.allclose(x[:, :2].mean(axis=0), 0.0)


def test_absolute_data_path_uses_the_entrys_default_location(tmp_path, monkeypatch):
    monkeypatch.setenv("PRIVMTL_FEMNIST_DIR", str(tmp_path / "leaf"))
    assert absolute_data_path("pmtl", "femnist-leaf", None) == str((tmp_path / "leaf").resolve())
    assert absolute_data_path("pmtl", "synthetic", None) is None
    monkeypatch.chdir(tmp_path)
    assert absolute_data_path("mpmtl", "table", "x.csv") == str(tmp_path.resolve() / "x.csv")


def test_importing_the_registry_does_not_import_torch():
    code = "import sys, privmtl.data.registry; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_pmtl_loaders_are_named_not_imported_with_the_registry():
    """The registry names its torch-backed loaders (``module:function``): reading it loads none
    of their modules, and each name resolves to a loader of that module."""
    code = (
        "import sys, privmtl.data.registry as r\n"
        "names = [i.load for i in r.REGISTRY['pmtl'].values()]\n"
        "print(all(isinstance(n, str) for n in names), 'privmtl.data.federated_loaders' in "
        "sys.modules, 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "False", "False"]
    for info in REGISTRY["pmtl"].values():
        assert info.loader().__module__ == "privmtl.data.federated_loaders"

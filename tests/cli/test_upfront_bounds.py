"""Sizes a user names are refused before anything is allocated when they cannot fit in memory:
one line naming the parameter, the memory it would need and the machine's."""

from __future__ import annotations

import pytest

import privmtl._validation as validation
from privmtl.cli import main
from privmtl.exceptions import DataFormatError, InvalidParameterError

GIB = 2**30


@pytest.fixture
def sixteen_gib(monkeypatch):
    """A machine of 16 GiB, whatever this one has; drawing a population would fail the test."""
    monkeypatch.setattr(validation, "physical_memory", lambda: 16 * GIB)

    def no_draw(*args, **kwargs):
        raise AssertionError("the population was drawn before its size was checked")

    monkeypatch.setattr("privmtl.data.synthetic_federated.synthetic_client_sizes", no_draw)


def _error_line(capsys, args):
    code = main(args)
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("privmtl: error:"), err
    return lines[0]


def test_a_billion_clients_are_refused_with_the_memory_they_need(capsys, sixteen_gib):
    line = _error_line(capsys, ["pmtl", "--data", "synthetic", "--num-clients", str(10**9)])
    assert "'--num-clients'" in line and "got 1000000000" in line
    assert "149 GiB of memory" in line and "16 GiB" in line


def test_a_billion_rounds_are_refused_with_the_memory_they_need(capsys, sixteen_gib):
    line = _error_line(capsys, ["pmtl", "--data", "synthetic", "--rounds", str(10**9)])
    assert "'--rounds'" in line and "got 1000000000" in line
    assert "1.19e+03 GiB of memory" in line and "16 GiB" in line


def test_the_library_and_the_generator_check_the_same_bounds(sixteen_gib):
    from privmtl.data.registry import load_federated
    from privmtl.data.streamed import SyntheticFederation
    from privmtl.federated.spec import RunSpec

    with pytest.raises(InvalidParameterError, match=r"'num_clients'.*149 GiB"):
        load_federated("synthetic", num_clients=10**9)
    with pytest.raises(InvalidParameterError, match=r"'n_clients'.*149 GiB"):
        SyntheticFederation(n_clients=10**9)
    with pytest.raises(InvalidParameterError, match=r"'rounds' parameter must be at most"):
        RunSpec(rounds=10**9)
    RunSpec(rounds=10**6)  # 1.2 GiB: fits


def test_a_table_too_large_for_memory_is_refused_before_its_matrix(tmp_path, monkeypatch):
    from privmtl.data.readers import read_table

    path = tmp_path / "t.csv"
    path.write_text("task,y,a,b\nt0,0,1,2\nt1,1,3,4\n")
    monkeypatch.setattr("privmtl.data.readers.physical_memory", lambda: 40)
    with pytest.raises(DataFormatError, match=r"2 rows of 2 feature columns would need"):
        read_table(path)


def test_a_flower_population_is_checked_before_any_process_starts(capsys, sixteen_gib, monkeypatch):
    pytest.importorskip("flwr")

    def no_launch(*args, **kwargs):
        raise AssertionError("Flower was launched before the population was checked")

    monkeypatch.setattr("privmtl.flower.launcher.run_local", no_launch)
    line = _error_line(
        capsys, ["flower", "local", "--data", "synthetic", "--num-clients", str(10**9)]
    )
    assert "'--num-clients'" in line and "149 GiB of memory" in line


def test_an_impossible_population_is_refused_before_the_numerical_libraries_load():
    """The size is checked from the command line before the run's modules (torch, the
    accountant) are imported: the refusal costs a fraction of a second, not their import."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from privmtl.cli import main\n"
        "rc = main(['pmtl', '--data', 'synthetic', '--num-clients', str(10**13)])\n"
        "print(rc, 'torch' in sys.modules, 'dp_accounting' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["2", "False", "False"], (done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1 and "'--num-clients'" in done.stderr
    assert "of memory" in done.stderr

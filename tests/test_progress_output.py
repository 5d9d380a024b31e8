"""Progress output and warnings fit where they go; `privmtl --help` stays light."""

from __future__ import annotations

import io
import math
import subprocess
import sys
import warnings

import click
import numpy as np
import pytest

from privmtl import _progress
from privmtl._progress import NORMAL, QUIET, VERBOSE, Progress, set_verbosity, summarize_warnings
from privmtl.cli import _LAZY_COMMANDS, cli
from privmtl.cli._common import run_cli


@pytest.fixture(autouse=True)
def _reset_verbosity():
    yield
    set_verbosity(NORMAL)


def _lines(total: int, level: int = NORMAL, **kw) -> list[str]:
    set_verbosity(level)
    buf = io.StringIO()  # not a terminal: plain lines
    with Progress(total=total, desc="job", unit="round", stream=buf, **kw) as bar:
        for _ in range(total):
            bar.update(1, loss="0.5")
    return buf.getvalue().splitlines()


def test_plain_lines_in_a_pipe():
    lines = _lines(100)
    assert len(lines) == 10
    assert lines[-1].startswith("job: 100/100 rounds loss=0.5")
    assert all("\r" not in line for line in lines)
    assert len(_lines(7)) == 7  # short loops: a line per step
    assert len(_lines(95)) == 10  # every 10th step, and the last one
    assert _lines(100, QUIET) == []
    assert len(_lines(100, VERBOSE)) == 100
    assert _lines(100, enabled=False) == []


def test_help_does_not_import_torch():
    code = (
        "import sys, contextlib, io\n"
        "from privmtl.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "    rc = main(['--help'])\n"
        "assert rc == 0 and 'pmtl-sweep' in out.getvalue(), out.getvalue()\n"
        "heavy = [m for m in ('torch', 'scipy', 'sklearn', 'matplotlib') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout.strip() == ""


def test_every_command_takes_quiet_and_verbose():
    ctx = click.Context(cli)
    for name in _LAZY_COMMANDS:
        command = cli.get_command(ctx, name)
        assert command is not None
        opts = {o for p in command.params for o in getattr(p, "opts", ())}
        assert {"--quiet", "--verbose"} <= opts, name


def test_piped_run_has_no_carriage_return_spam():
    # 30 rounds (the progress is thinned to every 3rd round) of a small population; the clients'
    # end of the run (--finetune auto's local training grid) is not what is tested
    code = (
        "from privmtl.cli import main\n"
        "raise SystemExit(main(['pmtl', '--data', 'synthetic', '--num-clients', '10', "
        "'--model', 'logreg', '--rounds', '30', '--epsilon', '2', '--reproducible-noise', "
        "'--server-update', 'offset', '--finetune', 'none']))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "\r" not in res.stderr
    progress_lines = [line for line in res.stderr.splitlines() if line.startswith("pmtl: ")]
    assert 1 <= len(progress_lines) <= 11
    assert progress_lines[-1].startswith("pmtl: 30/30 rounds")


def _noisy_group() -> click.Group:
    @click.group()
    def group() -> None:
        pass

    @group.command()
    def diverge() -> None:
        for _ in range(30):
            with np.errstate(over="warn"):
                np.float64(1e300) * np.float64(1e300)
            warnings.warn("the fit diverged: use fewer iterations", RuntimeWarning, stacklevel=1)
        click.echo("done")

    return group


def test_numerical_warnings_summed_up_in_one_line(capsys, monkeypatch):
    assert run_cli(_noisy_group(), ["diverge"]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("privmtl: warning: 60 numerical warnings (overflow ×30)")
    assert "the fit diverged: use fewer iterations" in err[0]
    shown: list[str] = []
    monkeypatch.setattr(
        "privmtl.cli._common._default_showwarning", lambda message, *a, **k: shown.append(message)
    )
    set_verbosity(VERBOSE)  # in full, each distinct warning once
    assert run_cli(_noisy_group(), ["diverge"]) == 0
    assert capsys.readouterr().err == ""
    assert len(shown) == 2


def test_summarize_warnings_none_when_empty():
    assert summarize_warnings([]) is None
    assert _progress.get_verbosity() == NORMAL


def test_sweep_plot_labels_and_colours(tmp_path, monkeypatch):
    import matplotlib.figure

    from privmtl.cli._common import spread
    from privmtl.experiments.sweep import plot_tradeoff

    figs: list[matplotlib.figure.Figure] = []
    monkeypatch.setattr(
        matplotlib.figure.Figure, "savefig", lambda self, *a, **k: figs.append(self)
    )
    summary = [
        {
            "method": f"m{i}",
            "target_epsilon": eps,
            "epsilon": eps,
            "mean": 0.5 + i / 100,
            "std": 0.0,
        }
        for i in range(9)
        for eps in (1.0, 2.0)
    ]
    summary.append({"method": "fedavg (non-private)", "target_epsilon": None, "epsilon": None,
                    "mean": 0.6, "std": 0.0})  # fmt: skip
    summary.append({"method": "mtl-trace", "target_epsilon": None, "epsilon": None, "mean": 0.7,
                    "std": 0.0})  # fmt: skip
    plot_tradeoff(summary, tmp_path / "p.png", metric_label="acc", title="t")
    ax = figs[0].axes[0]
    lines = [ln for ln in ax.get_lines() if not ln.get_label().startswith("_")]
    labels = [ln.get_label() for ln in lines]
    assert "fedavg (non-private)" in labels and "mtl-trace (non-private)" in labels
    assert not any("(non-private) (non-private)" in label for label in labels)
    assert len(lines) == 11
    assert len({tuple(np.atleast_1d(ln.get_color())) for ln in lines}) == 11
    assert spread({"mean": 0.5, "std": 0.0, "n": 1}) == " (1 seed)"
    assert spread({"mean": 0.5, "std": 0.01, "n": 3}) == " ± 0.0100 (3 seeds)"


def _warning_run(*, method, epsilon, seed):
    warnings.warn(f"diverged at seed {seed}", RuntimeWarning, stacklevel=1)
    return {"method": method, "target_epsilon": epsilon, "seed": seed, "nmse": 1.0}


def test_sweep_workers_hand_their_warnings_to_the_parent():
    from privmtl.experiments.sweep import run_sweep

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rows = run_sweep(
            _warning_run,
            methods=["a"],
            epsilons=[1.0],
            seeds=[0, 1, 2],
            private_methods=["a"],
            metric="nmse",
            n_jobs=2,
        )
    assert [r["seed"] for r in rows] == [0, 1, 2]
    assert sorted(str(w.message) for w in caught) == [f"diverged at seed {s}" for s in (0, 1, 2)]


@pytest.mark.parametrize("noise_std", [0.05, 0.0], ids=["private", "non-private"])
def test_flower_progress_line_carries_the_full_guarantee(noise_std):
    pytest.importorskip("flwr")
    from privmtl.data.federated import make_synthetic_federated
    from privmtl.experiments.pmtl import make_model
    from privmtl.flower._core import run_options
    from privmtl.flower.apps import progress_line
    from privmtl.flower.node_clients import NodeClients
    from privmtl.flower.server_run import ServerRun

    ds = make_synthetic_federated(random_state=0)
    opts = run_options({"rounds": 2, "clients-per-round": 6, "noise-std": noise_std,
                        "seed": 3, "noise-source": "seeded"})  # fmt: skip
    node = NodeClients(ds, make_model("logreg", ds, 3), partition_id=0, num_partitions=1)
    run = ServerRun(opts, node.init, ds.n_clients)
    run.history += [{"n_sampled": 6, "answered": [1, 2], "train_loss": 0.5, "seconds": 0.1,
                     "epsilon": 0.25 if noise_std else math.inf}] * 2  # fmt: skip
    line = progress_line(run)
    assert line.startswith("privmtl-flower round 2/2: sampled 6, answered 2, ")
    assert "loss" not in line  # a curator diagnostic of un-noised messages: never printed
    if noise_std:
        assert f"epsilon 0.25 (delta {run.delta:.2g}, add-remove, sampling " in line
        assert f"sampling {run.config.sampling}, rdp, noise seeded) (0.1 s)" in line
    else:
        assert "non-private (no noise)" in line and "epsilon" not in line


def test_sweep_plot_caption_fits_and_round_curves_never_share_a_colour(tmp_path, monkeypatch):
    import matplotlib.figure

    from privmtl.experiments.pmtl_sweep import plot_rounds
    from privmtl.experiments.sweep import plot_tradeoff

    figs: list[matplotlib.figure.Figure] = []
    monkeypatch.setattr(
        matplotlib.figure.Figure, "savefig", lambda self, *a, **k: figs.append(self)
    )
    summary = [{"method": "pmtl", "target_epsilon": e, "epsilon": e, "mean": 0.5, "std": 0.0}
               for e in (1.0, 2.0)]  # fmt: skip
    caption = (  # pmtl-sweep's caption
        "δ=0.02, neighbours: add-remove one client, sampling: poisson (q=20 of m=50), accountant: "
        "rdp, noise: secure; (γ, T, λ) selected per ε on validation accuracy"
    )
    plot_tradeoff(summary, tmp_path / "p.png", metric_label="acc", title="t", subtitle=caption)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = figs.pop()
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    box = fig.texts[0].get_window_extent(renderer)
    assert fig.texts[0].get_text().replace("\n", " ") == caption
    margin = 0.02 * fig.bbox.width  # nothing clipped, not even by a hair
    assert box.x0 >= margin and box.x1 <= fig.bbox.x1 - margin and box.y0 >= 0
    ax_box = fig.axes[0].get_tightbbox(renderer)
    assert ax_box.y0 >= box.y1 - 1  # the axes' labels sit above the caption
    rows = [
        {"method": f"m{i}", "target_epsilon": 1.0, "seed": 0, "guarantee": {"private": True},
         "train_loss_per_round": [1.0, 0.5], "epsilon_per_round": [0.5, 1.0]}
        for i in range(11)
    ]  # fmt: skip
    plot_rounds(rows, tmp_path / "r.png")
    lines = figs.pop().axes[0].get_lines()
    assert len(lines) == 11
    assert len({tuple(np.atleast_1d(ln.get_color())) for ln in lines}) == 11


def test_rounds_plot_has_no_empty_panel_and_equal_eps_curves_stay_distinct(tmp_path, monkeypatch):
    """Without published training losses the figure is the ε panel alone; PMTL and FedAvg at the
    same σ, q and T have the same ε curve, drawn with different line styles and markers."""
    import matplotlib.figure

    from privmtl.experiments.pmtl_sweep import plot_rounds

    figs: list[matplotlib.figure.Figure] = []
    monkeypatch.setattr(
        matplotlib.figure.Figure, "savefig", lambda self, *a, **k: figs.append(self)
    )
    eps = [0.2 * (t + 1) ** 0.5 for t in range(30)]
    rows = [{"method": m, "target_epsilon": 1.0, "seed": 0, "guarantee": {"private": True},
             "epsilon_per_round": eps} for m in ("pmtl", "fedavg")]  # fmt: skip
    plot_rounds(rows, tmp_path / "r.png")
    fig = figs.pop()
    assert len(fig.axes) == 1
    lines = fig.axes[0].get_lines()
    assert [ln.get_label() for ln in lines] == ["fedavg ε=1", "pmtl ε=1"]
    assert np.array_equal(lines[0].get_ydata(), lines[1].get_ydata())
    assert lines[0].get_linestyle() != lines[1].get_linestyle()
    assert lines[0].get_marker() != lines[1].get_marker()
    assert "not published" in fig.texts[0].get_text()

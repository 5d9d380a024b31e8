"""``privmtl evaluate --models DIR``: reload saved models and score them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from privmtl.cli._common import echo_json

__all__ = ["evaluate"]


@click.command()
@click.option(
    "--models",
    "models_dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    required=True,
    help="A directory written by --save-models.",
)
@click.option("--data", help="Data set (default: the one the run used, from model.json).")
@click.option("--data-path", type=click.Path(path_type=Path), help="Path of the data.")
@click.option("--seed", type=int, help="Data split seed (default: the run's).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def evaluate(
    models_dir: Path, data: str | None, data_path: Path | None, seed: int | None, as_json: bool
) -> None:
    """Score saved models on the test split: test_accuracy (PMTL) or nmse/auc (MP-MTL)."""
    meta_path = models_dir / "model.json"
    if not meta_path.is_file():
        raise click.BadParameter(f"{models_dir} has no model.json", param_hint="--models")
    try:
        family = json.loads(meta_path.read_text()).get("family")
    except json.JSONDecodeError as exc:
        raise click.BadParameter(
            f"{meta_path} is not valid JSON: {exc}", param_hint="--models"
        ) from None
    out: dict[str, Any]
    if family == "pmtl":
        from privmtl.experiments.pmtl import evaluate_saved

        out = evaluate_saved(models_dir, data=data, data_path=data_path, seed=seed)
    elif family == "mpmtl":
        from privmtl.experiments import mpmtl as mp

        out = mp.evaluate_saved(models_dir, data=data, data_path=data_path, seed=seed)  # type: ignore[attr-defined]
    else:
        raise click.BadParameter(f"unknown model family {family!r}", param_hint="--models")
    if as_json:
        echo_json(out)
        return
    metric = next(k for k in ("test_accuracy", "nmse", "auc") if k in out)
    click.echo(f"{out.get('method')} ({family}) from {models_dir}: {metric} = {out[metric]:.4f}")
    if out.get("summary"):
        click.echo(f"privacy: {out['summary']}")

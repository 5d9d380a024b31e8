"""``privmtl evaluate DIR``: reload saved models and score them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from privmtl.cli._common import echo_final_models, echo_json
from privmtl.cli._data_options import evaluate_data_options
from privmtl.cli._output_files import check_output_files
from privmtl.exceptions import DataFormatError
from privmtl.experiments import mpmtl, pmtl
from privmtl.federated.baseline import describe_gain
from privmtl.io import read_json

__all__ = ["evaluate"]

_PMTL_ONLY = ("client_column", "label_column")
_MPMTL_ONLY = ("task_column", "target_column", "train_fraction")


@click.command()
@click.argument(
    "directory",
    required=False,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
)
@click.option(
    "--models",
    "models_opt",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="The directory written by --save-models (same as the DIRECTORY argument).",
)
@click.option("--data", help="Data set (default: the one the run used, from model.json).")
@evaluate_data_options()
@click.option("--seed", type=int, help="Data split seed (default: the run's).")
@click.option(
    "--model",
    "model",
    metavar="MODULE:FACTORY|PATH.py:FACTORY",
    help="Rebuild a user's model with this factory (your own file or module), refused if its "
    "source's SHA-256 differs from the one model.json records. Needed for models someone else "
    "saved, unless --trust-code.",
)
@click.option(
    "--trust-code",
    is_flag=True,
    help="Run the factory source recorded in model.json (SHA-256 still checked) although this "
    "user did not sign the folder: only for folders from someone you trust.",
)
@click.option(
    "--per-client",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write one row per client (task) here (.csv or .parquet): its score now, beside the "
    "model it kept and its local-only score as the run recorded them in clients.csv.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def evaluate(
    directory: Path | None,
    models_opt: Path | None,
    data: str | None,
    seed: int | None,
    model: str | None,
    trust_code: bool,
    as_json: bool,
    per_client: Path | None,
    **opts: Any,
) -> None:
    """Score saved models on the test split: test_accuracy (PMTL) or nmse/auc (MP-MTL).

    DIRECTORY is what --save-models wrote. For models this user saved (model.json signed with the
    key in the user's config folder) everything comes from model.json: the data's absolute path,
    columns, scaling and split seed, and a user model's factory source (checked against its
    recorded SHA-256), so this works from any working directory without PYTHONPATH. A folder
    someone else wrote runs no code unless --model or --trust-code is given, and its recorded data
    path is not followed (pass --data-path).
    """
    if directory is not None and models_opt is not None and directory != models_opt:
        raise click.BadParameter(
            f"give the models directory once; got {directory} and --models {models_opt}",
            param_hint="DIRECTORY",
        )
    models_dir = directory if directory is not None else models_opt
    if models_dir is None:
        raise click.BadParameter("the models directory is required", param_hint="DIRECTORY")
    check_output_files({"per_client": per_client})
    meta_path = models_dir / "model.json"
    if not meta_path.is_file():
        raise click.BadParameter(f"{models_dir} has no model.json", param_hint="DIRECTORY")
    try:
        doc = read_json(meta_path)
    except DataFormatError as exc:
        raise click.BadParameter(str(exc).rstrip("."), param_hint="DIRECTORY") from None
    if not isinstance(doc, dict):
        raise click.BadParameter(
            f"{meta_path} must hold a JSON object; got {type(doc).__name__}",
            param_hint="DIRECTORY",
        )
    family = doc.get("family")
    if model is not None and family != "pmtl":
        raise click.BadParameter(f"does not apply to {family} models", param_hint="--model")
    columns = opts.pop("feature_columns")
    feature_columns = None if columns is None else [c.strip() for c in columns.split(",")]
    common: dict[str, Any] = {
        "data": data,
        "data_path": opts.pop("data_path"),
        "seed": seed,
        "per_client": per_client,
    }
    other = _MPMTL_ONLY if family == "pmtl" else _PMTL_ONLY
    for name in other:
        if opts.get(name) is not None:
            raise click.BadParameter(
                f"does not apply to {family} models", param_hint="--" + name.replace("_", "-")
            )
    out: dict[str, Any]
    if family == "pmtl":
        out = pmtl.evaluate_saved(
            models_dir,
            **common,
            client_column=opts["client_column"],
            label_column=opts["label_column"],
            feature_columns=feature_columns,
            scaling=opts["scaling"],
            model=model,
            trust_code=trust_code,
        )
    elif family == "mpmtl":
        out = mpmtl.evaluate_saved(
            models_dir,
            **common,
            task_column=opts["task_column"],
            target_column=opts["target_column"],
            feature_columns=feature_columns,
            normalize=opts["scaling"],
            train_fraction=opts["train_fraction"],
        )
    else:
        raise click.BadParameter(f"unknown model family {family!r}", param_hint="DIRECTORY")
    if as_json:
        echo_json(out)
        return
    metric = next(k for k in ("test_accuracy", "nmse", "auc") if k in out)
    click.echo(f"{out.get('method')} ({family}) from {models_dir}: {metric} = {out[metric]:.4f}")
    if family == "pmtl":
        gain = describe_gain(out)
        if gain is not None:
            click.echo(gain)
        echo_final_models(out, recorded=True)
    if out.get("summary"):
        click.echo(f"privacy: {out['summary']}")
    if out.get("per_client_file"):
        click.echo(f"per-client rows: {out['per_client_file']}")
    for note in out.get("notes") or ():
        click.echo(f"note: {note}")

"""A run's report as one self-contained HTML page: guarantee, curves, gains, references.

:func:`render_report` turns a result (``privmtl pmtl --json``, ``privmtl mpmtl --json``,
``privmtl evaluate --json``, or a folder of saved models: :func:`load_report_input`) and its
per-client rows (:mod:`privmtl.per_client`) into one HTML file that loads nothing at view time:
the plots are inline SVG drawn here (no script, no style sheet or font from elsewhere), so the file
can be mailed, archived or opened offline, and the plots can be checked by parsing the SVG.

The page holds the guarantee (ε, δ, relation, sampling, accountant, noise source, whether every
output is covered), ε per round and the validation accuracy on evaluation rounds
(``--eval-every``), the distribution over clients of the gain over training alone (a histogram
of the rows' ``gain``), the models the clients kept, and the references the result carries: the
local-only score, the released global model alone, MP-MTL's single-task nMSE. Every series is a
``<polyline>`` or a group of ``<rect>`` with a ``class`` naming it (:data:`SERIES`).
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from privmtl.exceptions import DataFormatError
from privmtl.gain import gain_verdict
from privmtl.io import check_output_file, write_atomic
from privmtl.per_client import read_rows
from privmtl.saved_files import linear_clients_file, verified_file

__all__ = [
    "SERIES",
    "check_report_path",
    "load_report_input",
    "render_report",
    "write_report",
]

SERIES = {
    "epsilon": "series-epsilon",
    "accuracy": "series-accuracy",
    "gain": "bar-gain",
    "kept": "bar-kept",
}
"""The SVG ``class`` of each plotted series: a polyline (ε, accuracy per round) or bars (the gain
histogram, the clients per kept model)."""

_W, _H, _PAD = 460, 210, 44
_TOP, _BASE = _PAD - 10, _H - _PAD + 10
_STYLE = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px auto;max-width:1040px;
padding:0 16px;
color:#1b1f24;background:#fff}
h1{font-size:1.5em;margin-bottom:4px}h2{font-size:1.15em;margin:26px 0 8px}
table{border-collapse:collapse;font-size:.95em}td,th{padding:4px 12px;border-bottom:1px solid #ddd;
text-align:left}.grid{display:flex;flex-wrap:wrap;gap:18px}.card{border:1px solid #ddd;
border-radius:6px;padding:10px;flex:1 1 460px;max-width:490px}.card h2{margin-top:4px}.note{color:#555;font-size:.9em}.bad{color:#b00020;font-weight:600}
.good{color:#0a7a3b;font-weight:600}svg text{font-size:11px;fill:#333}
"""


def check_report_path(path: str | Path, *, name: str = "report") -> Path:
    """``path`` checked before any computation: an ``.html`` file name in a writable folder."""
    return check_output_file(path, name=name, suffixes=(".html", ".htm"), kind="an .html")


def load_report_input(path: str | Path) -> tuple[dict[str, Any], Any]:
    """``(result, rows)`` of a result JSON file or a folder of saved models (its ``model.json``
    and, where listed, its ``clients.csv``); ``rows`` is None without per-client rows."""
    p = Path(path)
    if p.is_dir():
        meta_path = p / "model.json"
        doc = _read_json(meta_path)
        family = doc.get("family")
        run = doc.get("run")
        metrics = doc.get("metrics")
        result: dict[str, Any] = {
            **(run if isinstance(run, dict) else {}),
            **(metrics if isinstance(metrics, dict) else {}),
        }
        for key in ("method", "guarantee", "summary", "noise_source"):
            if doc.get(key) is not None:
                result[key] = doc[key]
        result["family"] = family
        result["data"] = (doc.get("data") or {}).get("data")
        rows = None
        if family == "pmtl":  # inside the folder, with the SHA-256 its model.json records
            listed = verified_file(p, doc, "clients", where=str(meta_path))
        else:
            listed = linear_clients_file(p, doc)
        if listed is not None:
            rows = read_rows(listed)
        return result, rows
    return _read_json(p), None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataFormatError(f"{path} is not a readable JSON result: {exc}.") from None
    if not isinstance(doc, dict):
        raise DataFormatError(f"{path} must hold a JSON object; got {type(doc).__name__}.")
    return doc


def write_report(path: str | Path, result: dict[str, Any], rows: Any = None, **kw: Any) -> Path:
    """Write :func:`render_report` of ``result`` and ``rows`` to ``path`` atomically."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(p, render_report(result, rows, **kw).encode())
    return p


# ------------------------------------------------------------------------------ the page
def _fmt(v: Any, spec: str = ".4g") -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int | float):
        return format(v, spec)
    return html.escape(str(v))


def _table(pairs: Sequence[tuple[str, str]]) -> str:
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{v}</td></tr>" for k, v in pairs)
    return f"<table>{body}</table>"


def render_report(result: dict[str, Any], rows: Any = None, *, source: str = "") -> str:
    """The report's HTML (module docstring) of ``result`` and its per-client ``rows`` (a
    :class:`pandas.DataFrame` of :mod:`privmtl.per_client`, or None)."""
    recorded = result.get("guarantee")
    g: dict[str, Any] = recorded if isinstance(recorded, dict) else {}
    mpmtl = "nmse" in result or "auc" in result or result.get("family") == "mpmtl"
    title = f"{result.get('method', '?')} on {result.get('data') or '?'}"
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>privmtl report: {html.escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>privmtl report: {html.escape(title)}</h1>",
        f"<p class='note'>{html.escape(source)}</p>" if source else "",
        "<div class='grid'><div class='card'><h2>Guarantee</h2>",
        _guarantee(result, g),
        "</div><div class='card'><h2>Results and references</h2>",
        _references(result, mpmtl),
        "</div></div><h2>Per round</h2><div class='grid'>",
        _per_round(result),
        "</div><h2>Did sharing help, and for whom?</h2><div class='grid'>",
        _gains(rows, mpmtl),
        _kept(result, rows),
        "</div>",
        "</body></html>",
    ]
    return "\n".join(p for p in parts if p)


def _guarantee(result: dict[str, Any], g: dict[str, Any]) -> str:
    covered = g.get("covered", result.get("covered"))
    eps = g.get("epsilon", result.get("epsilon"))
    pairs = [
        ("ε", _fmt(eps) if eps is not None else "∞ (not private)"),
        ("δ", _fmt(g.get("delta", result.get("delta")))),
        ("notion", _fmt(g.get("notion"))),
        ("relation", _fmt(g.get("relation", result.get("relation")))),
        ("sampling", _fmt(g.get("sampling", result.get("sampling")))),
        ("accountant", _fmt(g.get("accountant", result.get("accountant")))),
        ("noise source", _fmt(g.get("noise_source", result.get("noise_source")))),
        (
            "covered",
            "<span class='good'>yes: every output is covered</span>"
            if covered
            else "<span class='bad'>NO</span>: " + _fmt("; ".join(g.get("not_covered") or []))
            if covered is not None
            else "—",
        ),
    ]
    text = f"<p class='note'>{_fmt(result.get('summary'))}</p>" if result.get("summary") else ""
    return _table(pairs) + text


def _references(result: dict[str, Any], mpmtl: bool) -> str:
    if mpmtl:
        metric = "nmse" if "nmse" in result else "auc"
        pairs = [
            (f"test {metric}", _fmt(result.get(metric))),
            ("single-task learning nMSE (each task alone)", _fmt(result.get("stl_nmse"))),
            ("gain over single-task (nMSE points)", _fmt(result.get("gain_over_stl"))),
        ]
    else:
        pairs = [
            ("test accuracy (pooled)", _fmt(result.get("test_accuracy"))),
            ("mean client accuracy", _fmt(result.get("mean_client_accuracy"))),
            ("local training alone", _fmt(result.get("local_test_accuracy"))),
            ("released global model alone", _fmt(result.get("global_test_accuracy"))),
        ]
        gain = result.get("gain_over_local")
        if gain is not None:
            low, high = (result.get("gain_interval") or [None, None])[:2]
            pairs.append(
                (
                    "gain over local training",
                    f"{_fmt(gain * 100, '+.2f')} points [{_fmt(_times(low), '+.2f')}, "
                    f"{_fmt(_times(high), '+.2f')}]",
                )
            )
            if low is not None and high is not None:
                pairs.append(("verdict", _fmt(gain_verdict(float(low), float(high)))))
    pairs = [(k, v) for k, v in pairs if v != "—"]
    if not pairs:
        return "<p class='note'>The result holds no scores.</p>"
    return _table(pairs)


def _times(v: Any) -> Any:
    return None if v is None else float(v) * 100


def _per_round(result: dict[str, Any]) -> str:
    eps = result.get("epsilon_per_round")
    acc = result.get("val_accuracy_per_round")
    out = []
    if isinstance(eps, list) and eps:
        out.append(_card("ε after each round", _line(eps, SERIES["epsilon"], "ε")))
    else:
        out.append(
            "<p class='note'>No ε per round in this result (MP-MTL reports the run's ε).</p>"
        )
    if isinstance(acc, list) and any(a is not None for a in acc):
        out.append(
            _card("validation accuracy (evaluation rounds)", _line(acc, SERIES["accuracy"], "acc"))
        )
    else:
        out.append(
            "<p class='note'>No validation accuracy per round (run with --eval-every N).</p>"
        )
    return "\n".join(out)


def _card(title: str, body: str) -> str:
    return f"<div class='card'><div><b>{html.escape(title)}</b></div>{body}</div>"


def _line(values: Sequence[Any], cls: str, label: str) -> str:
    """A line over rounds 1..N of the values that are numbers (None: not recorded that round)."""
    pts = [(i + 1, float(v)) for i, v in enumerate(values) if v is not None and math.isfinite(v)]
    n = len(values)
    lo = min(v for _, v in pts) if pts else 0.0
    hi = max(v for _, v in pts) if pts else 1.0
    lo = min(lo, 0.0)
    span = hi - lo or 1.0

    def x(r: float) -> float:
        return _PAD + (r - 1) / max(n - 1, 1) * (_W - 2 * _PAD)

    def y(v: float) -> float:
        return _BASE - (v - lo) / span * (_BASE - _TOP)

    coords = " ".join(f"{x(r):.1f},{y(v):.1f}" for r, v in pts)
    dots = "".join(f"<circle cx='{x(r):.1f}' cy='{y(v):.1f}' r='2.5'/>" for r, v in pts)
    return (
        f"<svg width='{_W}' height='{_H}' role='img'>"
        + _axes("round", label, lo, hi, ("1", str(n)))
        + f"<polyline class='{cls}' fill='none' stroke='#1f6feb' stroke-width='2' "
        f"points='{coords}'/><g fill='#1f6feb'>{dots}</g></svg>"
    )


def _axes(xlabel: str, ylabel: str, lo: float, hi: float, xs: tuple[str, str] | None = None) -> str:
    """The axes, their labels, the y range ``lo``-``hi`` and the x range's ends ``xs``."""
    ends = (
        ""
        if xs is None
        else f"<text x='{_PAD}' y='{_BASE + 14}' text-anchor='middle'>{xs[0]}</text>"
        f"<text x='{_W - _PAD}' y='{_BASE + 14}' text-anchor='middle'>{xs[1]}</text>"
    )
    return (
        f"<line x1='{_PAD}' y1='{_BASE}' x2='{_W - _PAD}' y2='{_BASE}' stroke='#888'/>"
        f"<line x1='{_PAD}' y1='{_TOP}' x2='{_PAD}' y2='{_BASE}' stroke='#888'/>"
        f"<text x='{_W / 2}' y='{_H - 6}' text-anchor='middle'>{html.escape(xlabel)}</text>"
        f"<text x='4' y='{_TOP - 8}'>{html.escape(ylabel)}</text>"
        f"<text x='{_PAD - 4}' y='{_BASE}' text-anchor='end'>{lo:.3g}</text>"
        f"<text x='{_PAD - 4}' y='{_TOP + 4}' text-anchor='end'>{hi:.3g}</text>" + ends
    )


def _gains(rows: Any, mpmtl: bool) -> str:
    if rows is None:
        return (
            "<p class='note'>This result holds no per-client rows: pass --per-client FILE (or "
            "--save-models) to the run, or report on a saved folder.</p>"
        )
    gains = np.asarray(rows["gain"], dtype=np.float64)
    gains = gains[np.isfinite(gains)]
    unit = "nMSE" if mpmtl else "accuracy"
    if len(gains) == 0:
        return "<p class='note'>No client has a local-only score (no baseline in this run).</p>"
    bins = int(min(20, max(5, math.ceil(math.sqrt(len(gains))))))
    lo, hi = float(gains.min()), float(gains.max())
    if hi - lo < 1e-12:
        lo, hi = lo - 0.01, hi + 0.01
    counts, edges = np.histogram(gains, bins=bins, range=(lo, hi))
    top = max(int(counts.max()), 1)
    width = (_W - 2 * _PAD) / bins
    bars = []
    for i, c in enumerate(counts):
        h = c / top * (_BASE - _TOP)
        # green: every client in the bin gained; red: every one lost; grey: the bin holds 0
        colour = "#0a7a3b" if edges[i] > 0 else "#b00020" if edges[i + 1] < 0 else "#888"
        bars.append(
            f"<rect class='{SERIES['gain']}' data-count='{int(c)}' "
            f"x='{_PAD + i * width:.1f}' y='{_BASE - h:.1f}' width='{width - 1:.1f}' "
            f"height='{h:.1f}' fill='{colour}'><title>[{edges[i]:.3g}, {edges[i + 1]:.3g}): "
            f"{int(c)} clients</title></rect>"
        )
    svg = (
        f"<svg width='{_W}' height='{_H}' role='img'>"
        + _axes(
            f"gain over training alone ({unit})", "clients", 0, top, (f"{lo:+.3g}", f"{hi:+.3g}")
        )
        + "".join(bars)
        + "</svg>"
    )
    up, down = int((gains > 0).sum()), int((gains < 0).sum())
    summary = (
        f"<p>{up} of {len(gains)} clients gained, {down} lost, {len(gains) - up - down} "
        "unchanged"
        + (
            f" ({len(rows) - len(gains)} without a local-only score)"
            if len(rows) > len(gains)
            else ""
        )
        + ".</p>"
    )
    return _card("gain per client over training alone", svg + summary)


def _kept(result: dict[str, Any], rows: Any) -> str:
    counts = result.get("clients_per_final_model")
    if not isinstance(counts, dict) and rows is not None and "kept" in rows:
        counts = {str(k): int(v) for k, v in rows["kept"].value_counts(sort=False).items()}
    if not isinstance(counts, dict) or not counts:
        return ""
    top = max(max(counts.values()), 1)
    bar_h = 22
    height = bar_h * len(counts) + 20
    bars = []
    for i, (name, c) in enumerate(counts.items()):
        w = c / top * (_W - 200)
        bars.append(
            f"<text x='4' y='{i * bar_h + 16}'>{html.escape(str(name))}</text>"
            f"<rect class='{SERIES['kept']}' data-count='{int(c)}' x='150' y='{i * bar_h + 4}' "
            f"width='{w:.1f}' height='{bar_h - 6}' fill='#1f6feb'/>"
            f"<text x='{154 + w:.1f}' y='{i * bar_h + 16}'>{int(c)}</text>"
        )
    svg = f"<svg width='{_W}' height='{height}' role='img'>" + "".join(bars) + "</svg>"
    return _card("the model each client kept (clients)", svg)

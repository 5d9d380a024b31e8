"""The engine defaults the seeded engine tests were written with (imported by those tests and by
``federated/kill_run.py``; ``tests/conftest.py`` puts this folder on ``sys.path``).

They are given explicitly so that the tests' numbers stay: ``TrainConfig``'s own defaults are the
run spec's (``privmtl.federated.spec.SPEC``).
"""

from __future__ import annotations

from typing import Any

from privmtl.federated import TrainConfig

ENGINE_DEFAULTS = {
    "clip": 1.0,
    "clients_per_round": 10,
    "lam": 0.1,
    "server_update": "offset",
    "personal_init": "model",
}


def old_config(**kw: Any) -> TrainConfig:
    """A TrainConfig with :data:`ENGINE_DEFAULTS` for what ``kw`` leaves out (every client per
    round with ``sampling="all"`` and the workshop, as before)."""
    base = dict(ENGINE_DEFAULTS)
    if kw.get("sampling") == "all" or kw.get("method") == "workshop":
        base.pop("clients_per_round")
    return TrainConfig(**{**base, **kw})

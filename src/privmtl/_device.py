"""Where the engine computes: the ``device`` option (``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:N"``).

The device is an execution option: it changes where tensors live, not what is released or
accounted. The noise of every release is still drawn on the CPU by its noise source (OS entropy
for ``"secure"``, :mod:`privmtl.privacy.noise`) and only then moved to the device, and the
privacy ledger is the same. On the CPU (``"cpu"``, or ``"auto"`` without CUDA) results are bit
for bit those of a run without the option; on a GPU the floating-point order of operations
differs, so the numbers of a seeded run may differ in the last digits.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from privmtl.exceptions import InvalidParameterError

__all__ = [
    "DEFAULT_DEVICE",
    "DEVICES",
    "check_device",
    "one_blas_thread",
    "one_thread_per_worker",
    "resolve_device",
    "to_device",
]

DEVICES = ("auto", "cpu", "cuda")
"""The device names (``"cuda:N"`` names one GPU of several)."""
DEFAULT_DEVICE = "auto"
"""CUDA where ``torch.cuda.is_available()``, else the CPU."""

_CONSTRAINT = "one of {'auto', 'cpu', 'cuda', 'cuda:N'}"


def check_device(device: Any, *, name: str = "device") -> str:
    """``device`` as a string if it is a valid name (:data:`DEVICES` or ``"cuda:N"``), else raise
    :class:`InvalidParameterError`. Whether CUDA is present is checked by :func:`resolve_device`."""
    text = str(device) if isinstance(device, torch.device) else device
    if isinstance(text, str):
        if text in DEVICES:
            return text
        kind, _, index = text.partition(":")
        if kind == "cuda" and index.isdigit():
            return text
    raise InvalidParameterError(f"The '{name}' parameter must be {_CONSTRAINT}; got {device!r}.")


def resolve_device(device: Any = DEFAULT_DEVICE, *, name: str = "device") -> torch.device:
    """The :class:`torch.device` of a device name.

    ``"auto"`` is ``cuda`` when ``torch.cuda.is_available()`` and ``cpu`` otherwise; ``"cuda"``
    or ``"cuda:N"`` without CUDA (or without GPU ``N``) raises :class:`InvalidParameterError`
    naming the parameter, so that the command line exits with status 2 before any work.
    """
    text = check_device(device, name=name)
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if text == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise InvalidParameterError(
            f"The '{name}' parameter must name an available device; got {text!r}, but CUDA is "
            "not available here (use 'auto' or 'cpu')."
        )
    resolved = torch.device(text)
    count = torch.cuda.device_count()
    if resolved.index is not None and resolved.index >= count:
        raise InvalidParameterError(
            f"The '{name}' parameter must name an available GPU (0 to {count - 1}); got {text!r}."
        )
    return resolved


def to_device(tree: Any, device: torch.device | str) -> Any:
    """``tree`` (tensors in nested dicts, lists and tuples) with every tensor moved to ``device``.

    A tensor already there is returned as it is (no copy), so on the CPU nothing changes."""
    if isinstance(tree, torch.Tensor):
        return tree.to(device)
    if isinstance(tree, dict):
        return {k: to_device(v, device) for k, v in tree.items()}
    if isinstance(tree, list):
        return [to_device(v, device) for v in tree]
    if isinstance(tree, tuple):
        return tuple(to_device(v, device) for v in tree)
    return tree


@contextmanager
def one_thread_per_worker() -> Iterator[None]:
    """Run the block with one torch thread (restored afterwards).

    The work outside the rounds (every client's end of run, the scoring) is many small batched
    operations: intra-op threads cost more in coordination than they save there
    (``benchmarks/results/scale_progress.md`` measures it). A GPU is unaffected (its kernels do
    not use these threads).
    """
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with one_blas_thread():
            yield
    finally:
        torch.set_num_threads(old)


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """Run the block with numpy's and scipy's BLAS on one thread (restored afterwards).

    The engine's numpy products are small (a synthetic client's labels, a few hundred rows by
    ``d`` by ``C``): a multi-threaded BLAS wakes its threads for each of them, and threads that
    call it at once (the end of run's workers) wait on one another. One BLAS thread gives the
    same products (each output element is summed in the same order) at a fraction of the cost.
    Torch's own kernels are not affected.
    """
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield

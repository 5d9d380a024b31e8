"""A user's model factory: ``MODULE:FACTORY`` or ``PATH.py:FACTORY``, loaded, checked and recorded.

``FACTORY(n_features, n_classes)`` must return a :class:`torch.nn.Module` mapping float inputs
``(batch, n_features)`` to logits ``(batch, n_classes)``. Two spellings:

``MODULE:FACTORY``
    A module imported with the **current working directory first** on the import path (a
    ``mymodels.py`` next to where the command runs is found without ``PYTHONPATH``), then the
    installed packages.
``PATH.py:FACTORY``
    A Python file, relative to the working directory or absolute (``./mymodels.py:make_mlp``).

:func:`load_factory` captures the text of the file that defines the factory and its SHA-256 when it
is loaded; :meth:`UserFactory.record` is what a run writes into ``model.json`` and
:func:`factory_from_record` rebuilds the factory from that record alone, from any working
directory, after checking the hash (a record whose source was edited is refused). Running a
record's source, or importing a record's module, is the caller's decision:
:func:`~privmtl.federated.saved.build_model` does either only for a folder this user signed or
with ``--trust-code`` (importing a module runs it). A recorded installed module is imported from
the Python installation only, never from the working directory. Only the
factory's own file is recorded: a factory that imports other local modules needs them importable
when the models are rebuilt.

:meth:`UserFactory.build` calls the factory and runs one dummy forward pass, so that a factory that
fails, returns something else than a module, or returns logits of the wrong shape is reported in
one line naming ``--model`` before any training.
"""

from __future__ import annotations

import hashlib
import hmac
import importlib
import importlib.machinery
import importlib.util
import inspect
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from privmtl.exceptions import DataFormatError, InvalidParameterError
from privmtl.trust import untrusted_code

__all__ = ["UserFactory", "factory_from_record", "is_factory_spec", "load_factory"]

#: Rows of the dummy batch of the forward-pass check.
_CHECK_ROWS = 2


def is_factory_spec(spec: str) -> bool:
    """Whether ``spec`` names a user factory (``MODULE:FACTORY`` or ``PATH.py:FACTORY``)."""
    return ":" in spec


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _bad(spec: str, why: str) -> InvalidParameterError:
    return InvalidParameterError(f"The 'model' parameter (--model) {spec!r}: {why}")


@dataclass(frozen=True)
class UserFactory:
    """A loaded factory with the source it came from.

    Attributes
    ----------
    spec : str
        What the user wrote (``"mymodels:make_mlp"``, ``"./mymodels.py:make_mlp"``).
    factory : callable
        ``factory(n_features, n_classes) -> torch.nn.Module``.
    attr : str
        The factory's name in its module (dotted for a nested attribute).
    module : str or None
        The imported module's name (``MODULE:FACTORY``), None for a file.
    path : str or None
        Absolute path of the file that defines the factory, when there is one.
    source : str or None
        That file's text when it was loaded.
    """

    spec: str
    factory: Callable[..., Any]
    attr: str
    module: str | None
    path: str | None
    source: str | None

    @property
    def sha256(self) -> str | None:
        """SHA-256 of :attr:`source` (UTF-8), or None."""
        return None if self.source is None else _sha256(self.source)

    def record(self) -> dict[str, Any]:
        """What ``model.json`` keeps to rebuild the factory anywhere (:func:`factory_from_record`)."""
        return {
            "spec": self.spec,
            "factory": self.attr,
            "module": self.module,
            "path": self.path,
            "source": self.source,
            "sha256": self.sha256,
        }

    def build(self, n_features: int, n_classes: int) -> torch.nn.Module:
        """Call the factory and check its module with one forward pass of a zero batch.

        The check runs without gradients, in evaluation mode (no buffer update) and under a forked
        random state, so the returned module and the global random streams are as if it had not
        run.

        Raises
        ------
        InvalidParameterError
            The factory raised, did not return a ``torch.nn.Module``, its forward pass failed or
            its output is not ``(batch, n_classes)``; one line naming ``--model``.
        """
        try:
            net = self.factory(n_features, n_classes)
        except Exception as exc:  # a user's code: any error becomes one line
            raise _bad(
                self.spec,
                f"{self.attr}(n_features={n_features}, n_classes={n_classes}) failed: "
                f"{type(exc).__name__}: {exc}",
            ) from None
        if not isinstance(net, torch.nn.Module):
            raise _bad(
                self.spec,
                f"{self.attr}(n_features, n_classes) must return a torch.nn.Module; got "
                f"{type(net).__name__}.",
            )
        x = torch.zeros(_CHECK_ROWS, n_features)  # the engine feeds flat float rows
        modes = [(m, m.training) for m in net.modules()]
        try:
            with torch.random.fork_rng(devices=[]), torch.no_grad():
                net.eval()
                out = net(x)
        except Exception as exc:
            raise _bad(
                self.spec,
                f"the model's forward pass on a float batch of shape {tuple(x.shape)} failed: "
                f"{type(exc).__name__}: {exc}",
            ) from None
        finally:
            for module, mode in modes:  # as the factory left each submodule
                module.training = mode
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        if got != (_CHECK_ROWS, n_classes):
            raise _bad(
                self.spec,
                f"the model maps a batch of shape {tuple(x.shape)} to {got}; expected logits of "
                f"shape ({_CHECK_ROWS}, {n_classes}) (n_classes={n_classes}).",
            )
        return net


def _getattr_path(obj: Any, attr: str, spec: str) -> Callable[..., Any]:
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise _bad(spec, f"no attribute {attr!r} in the module.") from None
    if not callable(obj):
        raise _bad(spec, f"{attr!r} is not callable.")
    return obj  # type: ignore[no-any-return]


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def _load_file(spec: str, file: str, attr: str, cwd: Path) -> UserFactory:
    path = Path(file)
    path = (cwd / path if not path.is_absolute() else path).resolve()
    if not path.is_file():
        raise _bad(spec, f"file not found: {path}.")
    source = _read(path)
    if source is None:
        raise _bad(spec, f"cannot read {path} as UTF-8 text.")
    name = f"privmtl_user_model_{_sha256(str(path))[:12]}"
    module = _exec_module(name, source, str(path), spec)
    return UserFactory(spec, _getattr_path(module, attr, spec), attr, None, str(path), source)


def _exec_module(name: str, source: str, filename: str, spec: str) -> types.ModuleType:
    """Run ``source`` as a fresh module called ``name`` (registered in ``sys.modules``).

    As when Python runs a script, the file's folder (if it exists) is on the import path while
    the module runs, so that it can import its neighbours.
    """
    module = types.ModuleType(name)
    module.__file__ = filename
    previous = sys.modules.get(name)
    sys.modules[name] = module  # dataclasses, pickling and typing look the module up by name
    folder = Path(filename).parent
    added = folder.is_dir() and str(folder) not in sys.path
    if added:
        sys.path.insert(0, str(folder))
    try:
        exec(compile(source, filename, "exec"), module.__dict__)
    except Exception as exc:
        if previous is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = previous
        raise _bad(spec, f"running {filename} failed: {type(exc).__name__}: {exc}") from None
    finally:
        if added:
            sys.path.remove(str(folder))
    return module


def _installed(path: Path) -> bool:
    """Whether ``path`` belongs to the Python installation (stdlib, site-packages) or privmtl."""
    roots = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    roots.add(Path(__file__).resolve().parents[1])
    return any(path.is_relative_to(r) for r in roots)


def _local_module(cwd: Path, module_name: str) -> Path | None:
    """The file of ``module_name``'s top-level package or module in ``cwd``, if there is one."""
    top = module_name.split(".")[0]
    for candidate in (cwd / f"{top}.py", cwd / top / "__init__.py"):
        if candidate.is_file():
            return candidate.resolve()
    return None


def _forget_elsewhere(module_name: str, local: Path, spec: str) -> None:
    """Drop an already imported module of that name loaded from another place than ``local``."""
    top = module_name.split(".")[0]
    loaded = sys.modules.get(top)
    if loaded is None:
        return
    file = getattr(loaded, "__file__", None)
    if file is not None and Path(file).resolve() == local:
        return
    here = Path(file).resolve() if file else None
    if here is None or _installed(here):
        raise _bad(
            spec,
            f"{local} in the working directory has the name of the installed module {top!r}; "
            "rename your file.",
        )
    for name in [n for n in sys.modules if n == top or n.startswith(top + ".")]:
        del sys.modules[name]


def _load_module(spec: str, module_name: str, attr: str, cwd: Path) -> UserFactory:
    local = _local_module(cwd, module_name)
    if local is not None:
        _forget_elsewhere(module_name, local, spec)
    sys.path.insert(0, str(cwd))
    try:
        importlib.invalidate_caches()
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise _bad(
            spec,
            f"cannot import module {module_name!r} from the working directory {cwd} or the "
            f"installed packages ({type(exc).__name__}: {exc}). Use PATH.py:FACTORY for a file.",
        ) from None
    finally:
        try:
            sys.path.remove(str(cwd))
        except ValueError:
            pass
    factory = _getattr_path(module, attr, spec)
    path = None
    try:
        found = inspect.getsourcefile(factory) or getattr(module, "__file__", None)
        path = None if found is None else str(Path(found).resolve())
    except TypeError:  # a built-in or C callable has no source file
        path = None
    # an installed package is rebuilt by importing it; a user's file by its recorded text
    source = None if path is None or _installed(Path(path)) else _read(Path(path))
    return UserFactory(spec, factory, attr, module_name, path, source)


def load_factory(spec: str, *, cwd: str | Path | None = None) -> UserFactory:
    """Load ``MODULE:FACTORY`` (working directory first) or ``PATH.py:FACTORY``.

    Parameters
    ----------
    spec : str
        ``"mymodels:make_mlp"``, ``"pkg.models:build"``, ``"./mymodels.py:make_mlp"`` or
        ``"/abs/path/models.py:make"``.
    cwd : path-like, optional
        The directory searched first and relative paths are resolved against (default: the
        current working directory).

    Raises
    ------
    InvalidParameterError
        Malformed spec, missing file or module, failing import, missing or non-callable factory
        (one line naming ``--model``).
    """
    here = Path.cwd() if cwd is None else Path(cwd)
    target, sep, attr = str(spec).rpartition(":")
    if not sep or not target or not attr:
        raise _bad(spec, "must be MODULE:FACTORY or PATH.py:FACTORY.")
    if target.endswith(".py") or "/" in target or "\\" in target:
        return _load_file(spec, target, attr, here)
    return _load_module(spec, target, attr, here)


def _is_local(entry: str, cwd: Path) -> bool:
    """Whether the import path ``entry`` is the working directory (``""``, ``"."`` or its path)."""
    if entry in ("", "."):
        return True
    try:
        return Path(entry).resolve() == cwd
    except (OSError, ValueError):
        return False


def _spec_installed(found: importlib.machinery.ModuleSpec | None) -> bool:
    """Whether a module spec locates its module inside the Python installation."""
    if found is None:
        return False
    if found.origin in ("built-in", "frozen"):
        return True
    places = (
        [found.origin]
        if found.origin and found.has_location
        else list(found.submodule_search_locations or ())
    )
    return bool(places) and all(_installed(Path(p).resolve()) for p in places)


def _import_installed(spec: str, module_name: str, attr: str, where: str) -> UserFactory:
    """Import an installed package's factory: never from the working directory.

    The working directory is taken off the import path while the module is located and imported,
    and the module (already imported or not) must lie inside the Python installation; otherwise
    the refusal of :func:`~privmtl.trust.untrusted_code`. A built-in function is not a factory.
    """
    cwd = Path.cwd().resolve()
    saved = list(sys.path)
    sys.path[:] = [p for p in saved if not _is_local(p, cwd)]
    try:
        importlib.invalidate_caches()
        parts = module_name.split(".")
        for i in range(1, len(parts) + 1):  # each package level, before its code runs
            name = ".".join(parts[:i])
            loaded = sys.modules.get(name)
            try:
                found = (
                    getattr(loaded, "__spec__", None)
                    if loaded is not None
                    else importlib.util.find_spec(name)
                )
            except (ImportError, ValueError):
                found = None
            if not _spec_installed(found):
                raise untrusted_code(where, spec)
            if i < len(parts) or loaded is None:
                try:
                    importlib.import_module(name)
                except Exception as exc:
                    raise DataFormatError(
                        f"{where}: importing the installed module {name!r} of model {spec!r} "
                        f"failed ({type(exc).__name__}: {exc})."
                    ) from None
    finally:
        sys.path[:] = saved
    module = sys.modules[module_name]
    factory = _getattr_path(module, attr, spec)
    if inspect.isbuiltin(factory):
        raise untrusted_code(where, spec)
    return UserFactory(spec, factory, attr, module_name, getattr(module, "__file__", None), None)


def factory_from_record(record: dict[str, Any], *, where: str = "model.json") -> UserFactory:
    """Rebuild a factory from :meth:`UserFactory.record` (the recorded source, not the file).

    This runs the recorded source: call it only for a record the user trusts (see
    :func:`~privmtl.federated.saved.build_model`). A record of an installed package's factory
    (``module`` without source) is imported from the installation, never from the working
    directory.

    Raises
    ------
    DataFormatError
        The record has no source, or the source's SHA-256 differs from the recorded one (it was
        changed after the run), or an installed module lies outside the Python installation: one
        line, nothing is rebuilt.
    """
    spec = str(record.get("spec"))
    source, digest = record.get("source"), record.get("sha256")
    attr = str(record.get("factory"))
    if source is None and record.get("module"):  # an installed package's factory
        return _import_installed(spec, str(record["module"]), attr, where)
    if not isinstance(source, str) or not isinstance(digest, str):
        raise DataFormatError(
            f"{where}: the model {spec!r} was saved without its factory's source; it cannot be "
            "rebuilt."
        )
    now = _sha256(source)
    if not hmac.compare_digest(now, digest):
        raise DataFormatError(
            f"{where}: the recorded source of model {spec!r} changed after the run (sha256 "
            f"{now[:12]}... differs from the recorded {digest[:12]}...); refusing to rebuild it."
        )
    filename = str(record.get("path") or f"<{spec}>")
    module = _exec_module(f"privmtl_saved_model_{digest[:12]}", source, filename, spec)
    factory = _getattr_path(module, attr, spec)
    return UserFactory(spec, factory, attr, record.get("module"), record.get("path"), source)

"""Every use of Flower's private internals, behind one check of the installed Flower version.

privmtl's Flower transport speaks Flower's public API (``flwr.app``, ``flwr.clientapp``,
``flwr.serverapp``) except in three places, where it reaches into modules Flower does not document
and may change in any release:

``runtime``
    the long-lived ClientApp executor of :mod:`privmtl.flower.node` (Flower's Runtime API task
    protocol: ``flwr.supercore``, ``flwr.supernode``, ``flwr.proto``, ``flwr.cli.install``, ...)
    and the SuperNode loop whose idle waits it shortens (the ``time`` module of
    ``flwr.supernode.start_client_internal``). Fallback: ``None``, and the caller runs Flower's
    documented ``flower-supernode`` (one ClientApp process per message: slower, same results).
``object pulls``
    the retry defaults of Flower's object pull (``flwr.supercore.inflatable``). Fallback: Flower's
    own waits (slower on one machine, same results).
``SecAgg+ primitives``
    Flower's ECDH key agreement, Fernet encryption and Shamir sharing
    (``flwr.common.secure_aggregation``, ``flwr.supercore.primitives``). Fallback: the same
    primitives written here on the public APIs of ``cryptography`` and ``pycryptodome`` (Flower's
    own dependencies), byte for byte the same formats, so nodes on either path interoperate.

Each group is loaded only when the installed Flower is inside :data:`FLWR_RANGE` (the range of
the ``flower`` extra in ``pyproject.toml``, which these internals were written for) and every
import succeeds; otherwise the fallback is taken, with one :class:`~privmtl.exceptions.PrivmtlWarning`
per group and process naming the installed version. No other module of :mod:`privmtl.flower`
imports a private Flower module (``tests/flower/test_flwr_compat.py`` checks it).
"""

from __future__ import annotations

import base64
import functools
import importlib
import importlib.metadata
import re
import time
import warnings
from collections.abc import Mapping
from types import ModuleType, SimpleNamespace
from typing import Any

from privmtl.exceptions import PrivmtlWarning

__all__ = [
    "FLWR_RANGE",
    "flwr_version",
    "object_pulls",
    "runtime",
    "secagg_primitives",
    "shorten_object_waits",
    "shorten_supernode_polling",
    "version_supported",
]

FLWR_RANGE = ("1.41", "2")
"""Flower versions ``[low, high)`` the internals used here were written for (``flwr>=1.41,<2``)."""

# alias -> (module, attribute); attribute None: the module itself
_RUNTIME = {
    "install_from_fab": ("flwr.cli.install", "install_from_fab"),
    "LoadClientAppError": ("flwr.clientapp.client_app", "LoadClientAppError"),
    "get_load_client_app_fn": ("flwr.clientapp.utils", "get_load_client_app_fn"),
    "ErrorCode": ("flwr.common.constant", "ErrorCode"),
    "SubStatus": ("flwr.common.constant", "SubStatus"),
    "AcquireTaskRequest": ("flwr.proto.runtime_pb2", "AcquireTaskRequest"),
    "SendTaskHeartbeatRequest": ("flwr.proto.runtime_pb2", "SendTaskHeartbeatRequest"),
    "start_parent_process_monitor": ("flwr.supercore.app_utils", "start_parent_process_monitor"),
    "TaskType": ("flwr.supercore.constant", "TaskType"),
    "HeartbeatSender": ("flwr.supercore.heartbeat", "HeartbeatSender"),
    "RuntimeTokenHttpInterceptor": ("flwr.supercore.interceptors", "RuntimeTokenHttpInterceptor"),
    "RuntimeVersionHttpInterceptor": (
        "flwr.supercore.interceptors",
        "RuntimeVersionHttpInterceptor",
    ),
    "make_simple_http_retry_invoker": ("flwr.supercore.retry", "make_simple_http_retry_invoker"),
    "RuntimeHttpClient": ("flwr.supercore.runtime", "RuntimeHttpClient"),
    "flower_supernode": ("flwr.supernode.cli.flower_supernode", "flower_supernode"),
    "pull_task_input": ("flwr.supernode.runtime.run_clientapp", "pull_task_input"),
    "push_message": ("flwr.supernode.runtime.run_clientapp", "push_message"),
    "push_task_output": ("flwr.supernode.runtime.run_clientapp", "push_task_output"),
    "start_client_internal": ("flwr.supernode.start_client_internal", None),
}
_OBJECT_PULLS = {"inflatable_utils": ("flwr.supercore.inflatable.inflatable_utils", None)}
_SECAGG = {
    "generate_shared_key": (
        "flwr.common.secure_aggregation.crypto.symmetric_encryption",
        "generate_shared_key",
    ),
    "encrypt": ("flwr.common.secure_aggregation.crypto.symmetric_encryption", "encrypt"),
    "decrypt": ("flwr.common.secure_aggregation.crypto.symmetric_encryption", "decrypt"),
    "create_shares": ("flwr.common.secure_aggregation.crypto.shamir", "create_shares"),
    "combine_shares": ("flwr.common.secure_aggregation.crypto.shamir", "combine_shares"),
    "generate_key_pairs": ("flwr.supercore.primitives.asymmetric", "generate_key_pairs"),
    "private_key_to_bytes": ("flwr.supercore.primitives.asymmetric", "private_key_to_bytes"),
    "public_key_to_bytes": ("flwr.supercore.primitives.asymmetric", "public_key_to_bytes"),
    "bytes_to_private_key": ("flwr.supercore.primitives.asymmetric", "bytes_to_private_key"),
    "bytes_to_public_key": ("flwr.supercore.primitives.asymmetric", "bytes_to_public_key"),
}


def flwr_version() -> str | None:
    """The installed Flower's version (package metadata), or None when Flower is not installed."""
    try:
        return importlib.metadata.version("flwr")
    except importlib.metadata.PackageNotFoundError:
        return None


def _release(version: str) -> tuple[int, ...]:
    match = re.match(r"\d+(\.\d+)*", version)
    return tuple(int(p) for p in match.group(0).split(".")) if match else ()


def version_supported(version: str | None) -> bool:
    """Whether ``version`` lies in :data:`FLWR_RANGE` (release numbers only: ``1.42.0rc1`` is 1.42.0)."""
    if version is None:
        return False
    release = _release(version)
    return bool(release) and _release(FLWR_RANGE[0]) <= release < _release(FLWR_RANGE[1])


def _load(group: str, fallback: str, names: Mapping[str, tuple[str, str | None]]) -> Any:
    """``names`` imported, or None after one warning (per group) saying why and what runs instead."""
    version = flwr_version()
    if not version_supported(version):
        reason = (
            f"flwr {version} is outside the range {FLWR_RANGE[0]} <= flwr < {FLWR_RANGE[1]} "
            f"that privmtl's use of Flower's {group} was written for"
        )
        _warn(f"{reason}; {fallback}")
        return None
    loaded: dict[str, Any] = {}
    for alias, (module, attribute) in names.items():
        try:
            mod = importlib.import_module(module)
            loaded[alias] = mod if attribute is None else getattr(mod, attribute)
        except (ImportError, AttributeError) as ex:
            where = module if attribute is None else f"{module}.{attribute}"
            _warn(f"flwr {version} has no {where} ({type(ex).__name__}: {ex}); {fallback}")
            return None
    return SimpleNamespace(**loaded)


def _warn(message: str) -> None:
    warnings.warn(f"privmtl.flower: {message}", PrivmtlWarning, stacklevel=4)


@functools.cache
def runtime() -> Any:
    """Flower's Runtime API pieces of the long-lived ClientApp executor, or None (warned once).

    The namespace holds the names of ``_RUNTIME``'s keys; ``None`` means: run Flower's own
    ``flower-supernode`` (subprocess isolation) instead.
    """
    return _load(
        "SuperNode runtime internals",
        "SuperNodes run Flower's flower-supernode (one ClientApp process per message)",
        _RUNTIME,
    )


@functools.cache
def object_pulls() -> Any:
    """Flower's object-pull module (``inflatable_utils``), or None (warned once)."""
    return _load("object pull", "Flower's own object-pull waits are kept", _OBJECT_PULLS)


@functools.cache
def secagg_primitives() -> Any:
    """The SecAgg+ primitives: Flower's, or (warned once) the same ones on ``cryptography``.

    Byte-level API: ``key_pair() -> (private_pem, public_pem)``, ``shared_key(private_pem,
    public_pem)``, ``encrypt(key, plaintext)``, ``decrypt(key, ciphertext)``,
    ``create_shares(secret, threshold, num)``, ``combine_shares(shares)``.
    """
    fl = _load(
        "secure-aggregation primitives",
        "SecAgg+ uses the same primitives on cryptography and pycryptodome",
        _SECAGG,
    )
    if fl is None:
        return _public_secagg_primitives()

    def key_pair() -> tuple[bytes, bytes]:
        sk, pk = fl.generate_key_pairs()
        return fl.private_key_to_bytes(sk), fl.public_key_to_bytes(pk)

    def shared_key(private_pem: bytes, public_pem: bytes) -> bytes:
        return bytes(
            fl.generate_shared_key(
                fl.bytes_to_private_key(private_pem), fl.bytes_to_public_key(public_pem)
            )
        )

    return SimpleNamespace(
        key_pair=key_pair,
        shared_key=shared_key,
        encrypt=fl.encrypt,
        decrypt=fl.decrypt,
        create_shares=fl.create_shares,
        combine_shares=fl.combine_shares,
        source="flwr",
    )


def _public_secagg_primitives() -> Any:
    """Flower's SecAgg+ primitives on public APIs: SECP384R1 ECDH + HKDF-SHA256 (32 bytes, no
    salt or info) into a Fernet key; Shamir sharing of the PKCS#7-padded secret in 16-byte chunks,
    each share ``<4-byte little-endian index><16 bytes per chunk>`` (pycryptodome, ``ssss=False``)."""
    from Crypto.Protocol.SecretSharing import Shamir
    from Crypto.Util.Padding import pad, unpad
    from cryptography.fernet import Fernet
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    def key_pair() -> tuple[bytes, bytes]:
        sk = ec.generate_private_key(ec.SECP384R1())
        private = sk.private_bytes(
            encoding=serialization.Encoding.PEM,
            format=serialization.PrivateFormat.PKCS8,
            encryption_algorithm=serialization.NoEncryption(),
        )
        public = sk.public_key().public_bytes(
            encoding=serialization.Encoding.PEM,
            format=serialization.PublicFormat.SubjectPublicKeyInfo,
        )
        return private, public

    def shared_key(private_pem: bytes, public_pem: bytes) -> bytes:
        sk = serialization.load_pem_private_key(private_pem, password=None)
        pk = serialization.load_pem_public_key(public_pem)
        assert isinstance(sk, ec.EllipticCurvePrivateKey)
        assert isinstance(pk, ec.EllipticCurvePublicKey)
        secret = sk.exchange(ec.ECDH(), pk)
        derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=None).derive(secret)
        return base64.urlsafe_b64encode(derived)

    def create_shares(secret: bytes, threshold: int, num: int) -> list[bytes]:
        padded = pad(secret, 16)
        shares = [bytearray() for _ in range(num)]
        for start in range(0, len(padded), 16):
            for idx, part in Shamir.split(threshold, num, padded[start : start + 16], ssss=False):
                if not shares[idx - 1]:
                    shares[idx - 1] += idx.to_bytes(4, "little", signed=False)
                shares[idx - 1] += part
        return [bytes(s) for s in shares]

    def combine_shares(shares: list[bytes]) -> bytes:
        chunks = (len(shares[0]) - 4) >> 4
        padded = bytearray()
        for c in range(chunks):
            start = (c << 4) + 4
            parts = [(int.from_bytes(s[:4], "little"), s[start : start + 16]) for s in shares]
            padded += Shamir.combine(parts, ssss=False)
        try:
            return bytes(unpad(bytes(padded), 16))
        except ValueError:
            raise ValueError("Failed to combine shares") from None

    return SimpleNamespace(
        key_pair=key_pair,
        shared_key=shared_key,
        encrypt=lambda key, plaintext: Fernet(key).encrypt(plaintext),
        decrypt=lambda key, ciphertext: Fernet(key).decrypt(ciphertext),
        create_shares=create_shares,
        combine_shares=combine_shares,
        source="public",
    )


class _ShortSleeps:
    """Stands in for the ``time`` module of a Flower module: sleeps at most ``cap`` seconds.

    With ``idle_cap`` (> ``cap``), a long wait (Flower's idle poll for a message, ``sleep(3)``)
    backs off: ``cap`` after any short wait (the node waits for its ClientApp's reply, i.e. it
    just got a message), then 1.5 times longer on every idle poll that finds nothing, up to
    ``idle_cap``. An idle node then asks the SuperLink a few times a second instead of every
    ``cap`` seconds, which on a machine shared by many processes is most of a round's work.
    """

    def __init__(self, cap: float, idle_cap: float | None = None) -> None:
        self.cap = cap
        self.idle_cap = cap if idle_cap is None else max(cap, idle_cap)
        self._next = cap

    def sleep(self, seconds: float) -> None:
        seconds = float(seconds)
        if seconds >= 1.0 and self.idle_cap > self.cap:  # idle: back off
            wait, self._next = self._next, min(self.idle_cap, self._next * 1.5)
        else:  # busy: the next idle poll starts short again
            wait, self._next = min(seconds, self.cap), self.cap
        time.sleep(wait)

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def _shorten_module_sleeps(module: ModuleType, cap: float, idle_cap: float | None = None) -> None:
    """Cap ``module``'s ``time.sleep`` at ``cap`` seconds, idle waits backing off to
    ``idle_cap`` (:class:`_ShortSleeps`; left alone without a ``time`` module)."""
    if isinstance(getattr(module, "time", None), ModuleType):
        module.time = _ShortSleeps(cap, idle_cap)  # type: ignore[attr-defined]


def shorten_supernode_polling(cap: float, idle_cap: float | None = None) -> bool:
    """Cap the SuperNode loop's waits (``time.sleep(3)`` idle, ``time.sleep(0.5)`` for a reply)
    at ``cap`` seconds, the idle one backing off to ``idle_cap`` (:class:`_ShortSleeps`); False
    (nothing changed) without :func:`runtime`."""
    fl = runtime()
    if fl is None:
        return False
    _shorten_module_sleeps(fl.start_client_internal, cap, idle_cap)
    return True


def shorten_object_waits(first: float, cap: float) -> bool:
    """Set the retry defaults of Flower's object pull to ``first`` seconds, doubling up to
    ``cap``; False (Flower's own waits kept) without :func:`object_pulls`."""
    fl = object_pulls()
    if fl is None:
        return False
    for name in ("pull_objects", "pull_and_inflate_object_from_tree"):
        kw = getattr(getattr(fl.inflatable_utils, name, None), "__kwdefaults__", None)
        if kw and "initial_backoff" in kw and "backoff_cap" in kw:
            kw["initial_backoff"], kw["backoff_cap"] = first, cap
    return True

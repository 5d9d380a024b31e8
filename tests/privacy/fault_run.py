"""Run ``privmtl ARGS...`` and SIGKILL it at a chosen point (used by test_fault_injection.py).

Usage: python fault_run.py POINT K ARGS...

POINT is one of:

* ``recorded`` — release ``K`` is in the ledger (``fsync``-ed), not yet applied or checkpointed;
* ``mid-append`` — the process dies while writing release ``K``'s ledger line (half of it on
  disk, no newline: the torn last line of a write-ahead record that never returned);
* ``checkpointed`` — the checkpoint of step ``K`` is complete;
* ``hold`` — after the checkpoint of step ``K``, print ``HOLDING`` and sleep (a run that is still
  writing its directory when a second process comes);
* ``none`` — run to the end.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time


def main() -> None:
    point, k, args = sys.argv[1], int(sys.argv[2]), sys.argv[3:]

    import privmtl.checkpoint as ck
    from privmtl.cli import main as cli_main
    from privmtl.privacy.ledger import PrivacyLedger

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    if point == "recorded":
        real_record = PrivacyLedger.record

        def record(self, event, **kw):  # type: ignore[no-untyped-def]
            eps = real_record(self, event, **kw)
            if len(self.records) == k + 1:
                die()
            return eps

        PrivacyLedger.record = record  # type: ignore[method-assign]
    if point == "mid-append":
        real_append = PrivacyLedger._append

        def append(self, entry):  # type: ignore[no-untyped-def]
            if entry.get("index") == k:
                line = (json.dumps(entry, sort_keys=True) + "\n").encode()
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
                os.write(fd, line[: len(line) // 2])
                os.fsync(fd)
                die()
            return real_append(self, entry)

        PrivacyLedger._append = append  # type: ignore[method-assign]
    if point in ("checkpointed", "hold"):
        real_save = ck.save_checkpoint

        def save(directory, **kw):  # type: ignore[no-untyped-def]
            real_save(directory, **kw)
            if kw["step"] == k:
                if point == "checkpointed":
                    die()
                print("HOLDING", flush=True)
                time.sleep(120)

        ck.save_checkpoint = save  # type: ignore[assignment]
        for mod in ("privmtl.federated.protocol", "privmtl.flower._core"):
            __import__(mod)
            sys.modules[mod].save_checkpoint = save  # type: ignore[attr-defined]
    sys.exit(cli_main(args))


if __name__ == "__main__":
    main()

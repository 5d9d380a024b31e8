"""A small PMTL run on FEMNIST that SIGKILLs itself at a chosen point (used by test_protocol.py).

Usage: python kill_run.py DATA_DIR CACHE_DIR CHECKPOINT_DIR CONFIG_JSON POINT ROUND
POINT is one of: message (clients trained, nothing released), recorded (ledger entry on disk,
billboard not yet updated), state_written (new state file written, manifest not yet replaced),
checkpointed (checkpoint of the round complete), none (run to the end).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path


def main() -> None:
    data_dir, cache_dir, ckpt, cfg_json, point, at = sys.argv[1:7]
    at_round = int(at)

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: engine_defaults
    from engine_defaults import old_config

    import privmtl.checkpoint as ck
    from privmtl.data.federated import load_leaf
    from privmtl.federated import FemnistCNN
    from privmtl.federated.protocol import Trainer
    from privmtl.privacy.ledger import PrivacyLedger

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    if point == "recorded":
        real_record = PrivacyLedger.record

        def record(self, event, **kw):  # type: ignore[no-untyped-def]
            eps = real_record(self, event, **kw)
            if kw.get("round") == at_round:
                die()
            return eps

        PrivacyLedger.record = record  # type: ignore[method-assign]
    if point == "state_written":
        real_write = ck.write_atomic

        def write(path, data):  # type: ignore[no-untyped-def]
            real_write(path, data)
            if path.name == f"state-{at_round + 1:08d}.pt":
                die()

        ck.write_atomic = write  # type: ignore[assignment]

    def hook(t, sampled, messages):  # type: ignore[no-untyped-def]
        if point == "message" and t == at_round:
            die()
        return messages

    ds = load_leaf(data_dir, cache_dir=cache_dir)
    cfg = old_config(**json.loads(cfg_json))
    trainer = Trainer(ds, FemnistCNN(random_state=0), cfg, checkpoint_dir=ckpt, message_hook=hook)
    for rec in trainer:
        if point == "checkpointed" and rec.round == at_round:
            die()
    trainer.run()


if __name__ == "__main__":
    main()

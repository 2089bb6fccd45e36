"""Verifier pool: BLIP ITM re-ranks the L retrieved captions and keeps k (stage 2)."""

from __future__ import annotations

from typing import Any

from adjcap.actors.progress import StageMeter
from adjcap.actors.transport import pack, unpack
from adjcap import stages
from adjcap.config import Config
from adjcap.models.roles import load_verifier


class VerifierActor:
    def __init__(self, cfg: Config, board: Any = None):
        self.cfg = cfg
        self.meter = StageMeter("verify", board)
        self.verifier = load_verifier(cfg.verifier, cfg.device)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        states = unpack(batch)
        with self.meter.batch(states):
            stages.verify(states, self.verifier, self.cfg.verifier.keep)
        return pack(states)

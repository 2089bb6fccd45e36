"""Captioner pool: the unchanged IFCap captioner emits a beam of N candidates (stage 3)."""

from __future__ import annotations

from typing import Any

from adjcap.actors.progress import StageMeter
from adjcap.actors.transport import pack, unpack
from adjcap import stages
from adjcap.config import Config
from adjcap.models.roles import load_captioner


class CaptionerActor:
    def __init__(self, cfg: Config, board: Any = None):
        self.cfg = cfg
        self.meter = StageMeter("caption", board)
        self.role = load_captioner(cfg.captioner, cfg.device)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        states = unpack(batch)
        r = self.role
        with self.meter.batch(states):
            stages.caption(states, r.captioner, r.clip, self.cfg.captioner, r.vocabulary)
        return pack(states)

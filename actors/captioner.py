"""Captioner pool: the unchanged IFCap captioner emits a beam of N candidates (stage 3)."""

from __future__ import annotations

from typing import Any

from actors.transport import pack, unpack
from adjcap import stages
from adjcap.config import Config
from adjcap.pipeline import load_captioner_role


class CaptionerActor:
    def __init__(self, cfg: dict):
        self.cfg = Config.model_validate(cfg)
        self.captioner, self.clip, self.vocabulary = load_captioner_role(self.cfg)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        states = unpack(batch)
        stages.caption(states, self.captioner, self.clip, self.cfg, self.vocabulary)
        return pack(states)

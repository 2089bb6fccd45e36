"""Scorer pool: retrieval-encoder text tower + BLIP ITM score every beam candidate (stage 4).
Its output states are final: images and intermediate encodings are dropped."""

from __future__ import annotations

from typing import Any

from actors.transport import pack, unpack
from adjcap import stages
from adjcap.config import Config
from adjcap.pipeline import load_retrieval_encoder, load_verifier_role


class ScorerActor:
    def __init__(self, cfg: dict):
        self.cfg = Config.model_validate(cfg)
        self.encoder = load_retrieval_encoder(self.cfg)
        # the lavis backend scores candidates in its own pool (actors.lavis) ahead of this one
        self.verifier = None if self.cfg.verifier.backend == "lavis" else load_verifier_role(self.cfg)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        states = unpack(batch)
        stages.score(states, self.encoder, self.verifier)
        return pack(states, drop_image=True)

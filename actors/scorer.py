"""Scorer pool: retrieval-encoder text tower + BLIP ITM score every beam candidate (stage 4).
Its output states are final: images and intermediate encodings are dropped."""

from __future__ import annotations

from typing import Any

from actors.transport import pack, unpack
from adjcap import stages
from adjcap.config import Config
from adjcap.models.roles import ScorerEncoder, load_verifier


class ScorerActor:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        # the text tower; the image tower loads only if a state arrives without stage 1's embedding
        self.encoder = ScorerEncoder(cfg.retrieval.encoder, cfg.device)
        self.verifier = load_verifier(cfg.verifier, cfg.device)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        states = unpack(batch)
        stages.score(states, self.encoder, self.verifier)
        return pack(states, drop_image=True)

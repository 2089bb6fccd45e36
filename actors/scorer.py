"""Scorer pool: retrieval-encoder text tower + BLIP ITM score every beam candidate (stage 4).
Its output states are final: images and intermediate encodings are dropped."""

from __future__ import annotations

from typing import Any

from actors.transport import pack, unpack
from adjcap import stages
from adjcap.config import Config
from adjcap.models.roles import load_retrieval_encoder, load_verifier


class ScorerActor:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        # both towers: stage 1's image embedding normally rides in the state, but an image whose
        # embedding is missing is re-encoded here
        self.encoder = load_retrieval_encoder(cfg.retrieval.encoder, cfg.device)
        # the lavis backend scores candidates in its own pool (actors.lavis) ahead of this one
        self.verifier = None if cfg.verifier.backend == "lavis" else load_verifier(cfg.verifier, cfg.device)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        states = unpack(batch)
        stages.score(states, self.encoder, self.verifier)
        return pack(states, drop_image=True)

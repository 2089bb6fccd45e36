"""Scorer pool: the output-scorer encoder, the CLIPScore encoder (when it differs) and BLIP ITM score
every beam candidate (stage 4). Its output states are final: images and intermediate encodings are
dropped."""

from __future__ import annotations

from typing import Any

from adjcap.actors.progress import StageMeter
from adjcap.actors.transport import pack, unpack
from adjcap import stages
from adjcap.config import Config
from adjcap.models.roles import load_scorer


class ScorerActor:
    def __init__(self, cfg: Config, board: Any = None):
        self.cfg = cfg
        self.meter = StageMeter("score", board)
        # the lavis backend scores candidates with the verifier in its own pool (actors.lavis) ahead of this one
        lavis = {"verifier": None} if cfg.verifier.backend == "lavis" else None
        self.role = load_scorer(cfg.retrieval.encoder, cfg.scorer_encoder(), cfg.eval.clipscore, cfg.verifier,
                                cfg.device, loaded=lavis)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        states = unpack(batch)
        r = self.role
        with self.meter.batch(states):
            stages.score(states, r.output, r.verifier, r.clipscore, reuse_image_embedding=r.reuse_stage1)
        return pack(states, drop_image=True)

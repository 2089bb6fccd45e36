"""The ``lavis`` verifier backend's pools, run by Ray in the isolated LAVIS environment
(``adjcap.lavis_env.runtime_env``): LAVIS's own BLIP ITM verifies the L retrieved (stage 2) and scores
the N beam candidates (the verifier half of stage 4; the retrieval cosine stays in the scorer pool).
Imports only what that environment has: adjcap's stage code and the LAVIS-side model module."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from adjcap.actors.progress import StageMeter
from adjcap.actors.transport import pack, unpack
from adjcap import stages
from adjcap.config import Config
from adjcap.models.lavis_itm import load_lavis_verifier


def _load(cfg: Config):
    """``cfg`` resolved."""
    v = cfg.verifier
    return load_lavis_verifier(v.model, tokenizer=v.tokenizer, device=cfg.device, image_batch_size=v.batch_size)


class LavisVerifierActor:
    def __init__(self, cfg: Config, board: Any = None):
        self.cfg = cfg
        self.meter = StageMeter("verify", board)
        self.halved = stages.HalvedSizes()  # an out-of-memory halved batch size, carried to the next batches
        self.verifier = _load(cfg)

    def __call__(self, batch: pa.Table) -> pa.Table:
        states = unpack(batch)
        with self.meter.batch(states), stages.carrying(self.halved):
            stages.verify(states, self.verifier, self.cfg.verifier.keep)
        return pack(states)


class LavisScorerActor:
    def __init__(self, cfg: Config, board: Any = None):
        self.cfg = cfg
        self.meter = StageMeter("score-verifier", board)
        self.halved = stages.HalvedSizes()  # an out-of-memory halved batch size, carried to the next batches
        self.verifier = _load(cfg)

    def __call__(self, batch: pa.Table) -> pa.Table:
        states = unpack(batch)
        with self.meter.batch(states), stages.carrying(self.halved):
            stages.score_verifier(states, self.verifier, self.cfg.verifier.long_captions)
        return pack(states)

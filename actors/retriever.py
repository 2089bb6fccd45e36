"""Retriever pool: retrieval-encoder image tower + the shared caption index (stage 1)."""

from __future__ import annotations

from typing import Any

import ray

from actors.progress import StageMeter
from actors.transport import pack, unpack
from adjcap import stages
from adjcap.config import Config
from adjcap.index import CaptionIndex
from adjcap.models.roles import load_retrieval_encoder


class RetrieverActor:
    def __init__(self, cfg: Config, index_ref: ray.ObjectRef, board: Any = None):
        """``cfg`` resolved; ``index_ref``: (vectors, ids, precision, corpus texts), put once by the job."""
        self.cfg = cfg
        self.meter = StageMeter("retrieve", board)
        self.encoder = load_retrieval_encoder(cfg.retrieval.encoder, cfg.device, towers=("image",))
        vectors, ids, precision, self.texts = ray.get(index_ref)
        self.index = CaptionIndex.from_arrays(vectors, ids, device=cfg.device, precision=precision)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        states = unpack(batch)
        with self.meter.batch(states):
            stages.retrieve(states, self.encoder, self.index, self.texts, self.cfg.retrieval.top_l)
        return pack(states)

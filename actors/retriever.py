"""Retriever pool: retrieval-encoder image tower + the shared caption index (stage 1)."""

from __future__ import annotations

from typing import Any

import ray

from adjcap.actors.progress import StageMeter
from adjcap.actors.transport import pack, unpack
from adjcap import stages
from adjcap.config import Config
from adjcap.index import SharedIndex
from adjcap.models.roles import load_retrieval_encoder


class RetrieverActor:
    def __init__(self, cfg: Config, index_ref: ray.ObjectRef, board: Any = None):
        """``cfg`` resolved; ``index_ref``: the :class:`SharedIndex` the job put once. Its arrays are
        read-only views of this node's object store, shared by every retriever actor on the node."""
        self.cfg = cfg
        self.meter = StageMeter("retrieve", board)
        self.encoder = load_retrieval_encoder(cfg.retrieval.encoder, cfg.device, towers=("image",))
        shared: SharedIndex = ray.get(index_ref)
        self.index, self.texts = shared.open(cfg.device), shared.texts

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        states = unpack(batch)
        with self.meter.batch(states):
            stages.retrieve(states, self.encoder, self.index, self.texts, self.cfg.retrieval.top_l)
        return pack(states)

"""Retriever pool: retrieval-encoder image tower + the shared caption index (stage 1)."""

from __future__ import annotations

from typing import Any, Callable

from actors.transport import pack, unpack
from adjcap import stages
from adjcap.config import Config
from adjcap.index import CaptionIndex
from adjcap.pipeline import load_retrieval_encoder


class RetrieverActor:
    def __init__(self, cfg: dict, shared_index: Callable[[], tuple[Any, Any, str, list[str]]]):
        self.cfg = Config.model_validate(cfg)
        self.encoder = load_retrieval_encoder(self.cfg, towers=("image",))
        vectors, ids, precision, self.texts = shared_index()
        self.index = CaptionIndex.from_arrays(vectors, ids, device=self.cfg.device, precision=precision)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        states = unpack(batch)
        stages.retrieve(states, self.encoder, self.index, self.texts, self.cfg.retrieval.top_l)
        return pack(states)

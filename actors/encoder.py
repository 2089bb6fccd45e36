"""Corpus-encoder pool: encodes index shards of the caption corpus and writes them atomically."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np

from adjcap import index as idx
from adjcap.config import Config
from adjcap.pipeline import encode_shard, load_retrieval_encoder


class CorpusEncoderActor:
    def __init__(self, cfg: dict, out_dir: str, shared_corpus: Callable[[], tuple[list[str], np.ndarray]]):
        self.cfg = Config.model_validate(cfg)
        self.out = Path(out_dir)
        self.encoder = load_retrieval_encoder(self.cfg, towers=("text",))
        self.texts, self.ids = shared_corpus()

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        done = []
        for shard, start, end in zip(batch["shard"], batch["start"], batch["end"]):
            shard, start, end = int(shard), int(start), int(end)
            vecs = encode_shard(self.encoder, self.texts[start:end])
            idx.write_shard(self.out, shard, vecs, self.ids[start:end], precision=self.cfg.retrieval.index_precision)
            done.append(shard)
        return {"shard": np.array(done, dtype=np.int64)}

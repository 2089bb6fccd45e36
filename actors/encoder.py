"""Corpus-encoder pool: encodes index shards of the caption corpus and writes them atomically."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import ray

from adjcap.actors.metrics import CORPUS_ENCODED
from adjcap.actors.progress import StageMeter
from adjcap.config import Config
from adjcap.index import encode_range
from adjcap.models.roles import load_retrieval_encoder


class CorpusEncoderActor:
    def __init__(self, cfg: Config, out_dir: str, corpus_ref: ray.ObjectRef, board: Any = None):
        """``cfg`` resolved; ``corpus_ref``: (texts, ids), put once by the job."""
        self.cfg = cfg
        self.meter = StageMeter("encode", board, counter=CORPUS_ENCODED)
        self.out = Path(out_dir)
        self.encoder = load_retrieval_encoder(cfg.retrieval.encoder, cfg.device, towers=("text",))
        self.texts, self.ids = ray.get(corpus_ref)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        done = []
        for shard, start, end in zip(batch["shard"], batch["start"], batch["end"]):
            t = time.perf_counter()
            encode_range(self.encoder, self.texts, self.ids, int(shard), int(start), int(end), self.out,
                         self.cfg.retrieval.index_precision)
            done.append(int(shard))
            self.meter.record(int(end) - int(start), 0, time.perf_counter() - t)
        return {"shard": np.array(done, dtype=np.int64)}

"""Corpus encode: CPU tasks tokenise index shards of the caption corpus (:func:`tokenize_shard`), and the
encoder pool encodes their token ids and writes each shard atomically (:class:`CorpusEncoderActor`), so the
GPU actor's thread does not run the tokenizer (~60-135 us of Python per caption) while it could encode the
shard before; a corpus of one shard is tokenised by the actor (nothing to overlap)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import ray

from adjcap.actors.metrics import CORPUS_ENCODED
from adjcap.actors.progress import StageMeter
from adjcap.config import Config, EncoderCfg
from adjcap.index import encode_ids_range, tokenize_range
from adjcap.models.roles import load_retrieval_encoder


def tokenize_shard(batch: dict[str, np.ndarray], *, encoder: EncoderCfg) -> dict[str, np.ndarray]:
    """One shard's row (``shard``, ``start``, ``end``, its captions ``texts``) -> the row with the captions'
    token ids instead (``tokens``: int32, flattened, [1, n x context]), tokenised as the encoder would."""
    from adjcap.models.clip import tokenizer_for

    texts = list(batch["texts"][0])
    ids = tokenize_range(tokenizer_for(encoder), texts, 0, len(texts))
    return {"shard": batch["shard"], "start": batch["start"], "end": batch["end"], "tokens": ids.reshape(1, -1)}


class CorpusEncoderActor:
    def __init__(self, cfg: Config, out_dir: str, ids_ref: ray.ObjectRef, board: Any = None):
        """``cfg`` resolved; ``ids_ref``: the corpus ids, put once by the job. A shard's row brings its
        captions' ``tokens`` (the CPU tasks') or the captions themselves (``texts``)."""
        self.cfg = cfg
        self.meter = StageMeter("encode", board, counter=CORPUS_ENCODED)
        self.out = Path(out_dir)
        self.encoder = load_retrieval_encoder(cfg.retrieval.encoder, cfg.device, towers=("text",))
        self.ids = ray.get(ids_ref)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        done = []
        tokens = batch.get("tokens")
        for i, (shard, start, end) in enumerate(zip(batch["shard"], batch["start"], batch["end"])):
            t = time.perf_counter()
            n = int(end) - int(start)
            ids = (np.asarray(tokens[i]).reshape(n, -1) if tokens is not None else
                   tokenize_range(self.encoder.tokenizer, list(batch["texts"][i]), 0, n))
            encode_ids_range(self.encoder, ids, self.ids, int(shard), int(start), int(end), self.out,
                             self.cfg.retrieval.index_precision)
            done.append(int(shard))
            self.meter.record(n, 0, time.perf_counter() - t)
        return {"shard": np.array(done, dtype=np.int64)}

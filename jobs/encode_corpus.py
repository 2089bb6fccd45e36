"""Encode a caption corpus with the retrieval encoder into a content-addressed index.

Shards are encoded by a fixed-size pool of corpus-encoder actors and written atomically; a rerun
verifies finished shards and skips them, and a partial shard is never taken for a finished one."""

from __future__ import annotations

import time
from pathlib import Path

import ray
from ray.data import ActorPoolStrategy

from actors.encoder import CorpusEncoderActor
from adjcap import index as idx
from adjcap.config import Config
from adjcap.pipeline import encoder_identity, finalize, index_dir_for, index_ready, load_benchmark_corpus, shard_ranges
from jobs.ray_session import pool_resources, ray_session


def ensure_index(cfg: Config, corpus=None) -> Path:
    """Inside a Ray session: the index for cfg's encoder and corpus, encoding what is missing."""
    corpus = corpus if corpus is not None else load_benchmark_corpus(cfg)
    enc_id = encoder_identity(cfg)
    out = index_dir_for(cfg, enc_id, corpus.fingerprint)
    if index_ready(out, enc_id, corpus.fingerprint):
        print(f"index: {out} (complete, {len(corpus.texts)} captions)")
        return out
    ranges = shard_ranges(len(corpus.texts), cfg.retrieval.shard_size)
    todo = [r for r in ranges if idx.verify_shard(out, r[0]) is None]
    print(f"index: encoding {len(todo)}/{len(ranges)} shards of {len(corpus.texts)} captions with {enc_id} -> {out}")
    t0 = time.time()
    if todo:
        texts_ref = ray.put((corpus.texts, corpus.ids))
        shared = _getter(texts_ref)
        ds = ray.data.from_items([{"shard": s, "start": a, "end": b} for s, a, b in todo], override_num_blocks=len(todo))
        ds = ds.map_batches(
            CorpusEncoderActor,
            fn_constructor_kwargs={"cfg": cfg.model_dump(mode="json"), "out_dir": str(out), "shared_corpus": shared},
            batch_size=1,
            batch_format="numpy",
            compute=ActorPoolStrategy(size=min(cfg.ray.workers, len(todo))),
            **pool_resources(cfg, "retriever"),
        )
        done = sorted(int(x) for b in ds.iter_batches(batch_format="numpy") for x in b["shard"])
        assert done == sorted(s for s, _, _ in todo), f"shards missing after encoding: {set(s for s, _, _ in todo) - set(done)}"
    finalize(out, enc_id, corpus, len(ranges))
    dt = time.time() - t0
    print(f"index: done in {dt:.1f}s ({len(corpus.texts) / max(dt, 1e-9):.0f} captions/s)")
    return out


def _getter(ref):
    def get():
        return ray.get(ref)

    return get


def main(cfg: Config) -> Path:
    with ray_session(cfg):
        out = ensure_index(cfg)
    print(out)
    return out

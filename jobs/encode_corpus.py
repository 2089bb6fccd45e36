"""Encode a caption corpus with the retrieval encoder into its content-addressed index.

The index lifecycle (address, readiness, shard ranges, finalize) is :func:`adjcap.index.ensure_index`;
this job only supplies its ``encode_missing`` step: a fixed-size pool of corpus-encoder actors encodes the
shards, one per call, each written atomically (a rerun verifies finished shards and skips them); on GPUs
CPU tasks tokenise each shard's captions beside them (:func:`tokenize_apart`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import ray
from ray.data import ActorPoolStrategy

from adjcap.actors.encoder import CorpusEncoderActor, tokenize_shard
from adjcap.engine.cluster_plan import PoolPlan
from adjcap.config import Config
from adjcap.data.corpus import Corpus
from adjcap.index import IndexPlan, benchmark_corpus, ensure_index
from adjcap.models.budget import corpus_encode_bytes
from adjcap.models.sources import clip_source
from adjcap.jobs.progress_display import tracked
from adjcap.jobs.ray_session import has_gpus, pool_resources, ray_session


def embed_width(enc: Any, default: int = 1280) -> int:
    """An open_clip encoder's embedding width, resolved without loading it (:func:`clip_source`: a
    local checkpoint's side config, a tag's architecture); ``default`` (bigG's, the widest the presets
    use) when it cannot be resolved here (the actors then say why)."""
    try:
        return int(clip_source(enc.model, enc.pretrained).model_cfg["embed_dim"])
    except (OSError, ValueError, KeyError):
        return default


def tokenize_apart(cfg: Config, shards: int) -> bool:
    """Inside the job's Ray session: whether CPU tasks tokenise the shards (``ray.tokenize_tasks``; None: on a
    cluster with GPUs) rather than the encoder actors; only with a shard to overlap with (one shard's tokens
    are needed before it encodes)."""
    if shards < 2:
        return False
    return cfg.ray.tokenize_tasks if cfg.ray.tokenize_tasks is not None else has_gpus()


def encode_with_pool(cfg: Config):
    """``encode_missing`` for :func:`ensure_index`: the missing shards on the encoder pool (inside a
    Ray session; ``cfg`` resolved)."""

    def run(plan: IndexPlan) -> None:
        t0 = time.time()
        n = sum(b - a for _, a, b in plan.todo)
        ids_ref = ray.put(np.asarray(plan.corpus.ids))
        texts = plan.corpus.texts
        with tracked(cfg.ray, "encode-corpus", ["encode"], n, unit="captions") as board:
            # each shard's row carries its own captions: a task or actor reads those, never the whole corpus
            ds = ray.data.from_items([{"shard": s, "start": a, "end": b, "texts": list(texts[a:b])}
                                      for s, a, b in plan.todo], override_num_blocks=len(plan.todo))
            if tokenize_apart(cfg, len(plan.todo)):
                # the captions' token ids made in CPU tasks, beside the encoder pool (not in its GPU's
                # thread): the next shard is tokenised while one is encoded
                ds = ds.map_batches(tokenize_shard, fn_kwargs={"encoder": cfg.retrieval.encoder},
                                    batch_size=1, batch_format="numpy", num_cpus=1)
            ds = ds.map_batches(
                CorpusEncoderActor,
                fn_constructor_kwargs={"cfg": cfg, "out_dir": str(plan.out), "ids_ref": ids_ref,
                                       "board": board},
                batch_size=1,
                batch_format="numpy",
                compute=ActorPoolStrategy(size=min(cfg.ray.workers, len(plan.todo))),
                # the model plus the corpus ids it holds and one shard's tokens and embeddings (Ray's issue
                # detector otherwise warns that the actor uses more than it asked for)
                **pool_resources(PoolPlan.of(cfg), "encoder", corpus_encode_bytes(
                    len(plan.corpus.texts), cfg.retrieval.shard_size, embed_width(cfg.retrieval.encoder))),
            )
            ds.materialize()
        dt = time.time() - t0
        print(f"index: {len(plan.todo)} shards ({n} captions) encoded in {dt:.1f}s ({n / max(dt, 1e-9):.0f} captions/s)")

    return run


def index_for(cfg: Config, corpus: Corpus) -> Path:
    """Inside a Ray session: the finished index for cfg's encoder and corpus (``cfg`` resolved)."""
    out = ensure_index(cfg.retrieval, cfg.paths.cache_dir, corpus, encode_with_pool(cfg), log=print,
                       corpus_format=cfg.benchmark_cfg().corpus_format)
    print(f"index: {out} ({len(corpus.texts)} captions)")
    if cfg.captioner.entities.mode == "frequency":  # stage 3's nouns, tagged once here, not per image
        from adjcap.index.nouns import ensure_nouns

        try:
            ensure_nouns(out, corpus.texts, corpus.fingerprint, cfg.captioner.entities.tagger, say=print)
        except (LookupError, OSError) as e:  # e.g. no NLTK data: stage 3 reports it per image, as before
            print(f"entities: the corpus nouns were not tagged ({e})")
    return out


def main(cfg: Config) -> Path:
    cfg = cfg.resolved()
    corpus = benchmark_corpus(cfg.benchmark_cfg(), cfg.benchmark)
    with ray_session(cfg):
        out = index_for(cfg, corpus)
    print(out)
    return out

"""The in-process driver: records -> feature rows with the four stages in one Python process (tests,
notebooks, debugging). The Ray job (``adjcap run-job``) runs the same stage functions on actor pools
whose models are loaded by the same :mod:`adjcap.models.roles` functions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from adjcap import image_state, stages
from adjcap.config import Config
from adjcap.data.records import Record
from adjcap.index import CaptionIndex, encode_shards_in_process, encoder_identity, ensure_index
from adjcap.index.lifecycle import search_corpus
from adjcap.models import roles
from adjcap.stage_cache import StageCache, stage_counts


@dataclass
class Models:
    retrieval: Any
    index: CaptionIndex
    corpus_texts: Sequence[str]
    verifier: Any
    captioner: roles.CaptionerRole
    scorer: roles.ScorerRole


def load_models(cfg: Config, benchmark: str | None = None) -> Models:
    """Every role's models in this process, and the corpus index (built here when missing)."""
    cfg = cfg.resolved()
    name = benchmark or cfg.benchmark
    bench = cfg.benchmark_cfg(name)
    corpus = search_corpus(cfg.retrieval, bench, name, cfg.paths.cache_dir)
    retrieval = roles.load_retrieval_encoder(cfg.retrieval.encoder, cfg.device)
    out = ensure_index(cfg.retrieval, cfg.paths.cache_dir, corpus, encode_shards_in_process(retrieval),
                       corpus_format=bench.corpus_format)
    index = CaptionIndex.load(out, device=cfg.device, encoder_id=encoder_identity(cfg.retrieval.encoder),
                              corpus_fingerprint=corpus.fingerprint)
    verifier = roles.load_verifier(cfg.verifier, cfg.device)
    scorer = roles.load_scorer(cfg.retrieval.encoder, cfg.scorer_encoder(), cfg.eval.clipscore, cfg.verifier,
                               cfg.device, loaded={"retrieval": retrieval, "verifier": verifier})
    return Models(retrieval, index, corpus.texts, verifier, roles.load_captioner(cfg.captioner, cfg.device), scorer)


def process_states(states: list[image_state.ImageState], models: Models, cfg: Config) -> list[image_state.ImageState]:
    """The four stages on decoded states (``cfg`` resolved)."""
    c = models.captioner
    stages.retrieve(states, models.retrieval, models.index, models.corpus_texts, cfg.retrieval.top_l)
    stages.verify(states, models.verifier, cfg.verifier.keep)
    stages.caption(states, c.captioner, c.clip, cfg.captioner, c.vocabulary)
    sc = models.scorer
    stages.score(states, sc.output, sc.verifier, sc.clipscore, reuse_image_embedding=sc.reuse_stage1)
    return states


def run_pipeline(records: Sequence[Record], cfg: Config, models: Models | None = None,
                 benchmark: str | None = None, batch_size: int | None = None,
                 stage_cache: StageCache | None = None, counts: dict[str, int] | None = None) -> list[dict[str, Any]]:
    """Records -> feature rows (docs/architecture.md, "Data flow of one image"), one per record, in record order. With a
    ``stage_cache`` stored stage outputs are reused and new ones stored; ``counts`` (when given)
    accumulates the images each stage processed."""
    cfg = cfg.resolved()
    benchmark = benchmark or cfg.benchmark
    models = models or load_models(cfg, benchmark)
    bs = batch_size or cfg.ray.batch_size
    rows: list[dict[str, Any]] = []
    known = cfg.benchmarks.get(benchmark)
    exif = known.applies_exif() if known is not None else True  # records of an unconfigured folder: users' photos
    for start in range(0, len(records), bs):
        states = [image_state.decode_state(r.image_id, benchmark, r.split, r.domain, r.image_path, r.error, exif)
                  for r in records[start : start + bs]]
        if stage_cache is not None:
            stage_cache.prefill(states)
        process_states(states, models, cfg)
        if stage_cache is not None:
            stage_cache.store(states)
        if counts is not None:
            for stage, n in stage_counts(states).items():
                counts[stage] = counts.get(stage, 0) + n
        rows.extend(s.to_row() for s in states)
    return rows

"""The in-process driver: records -> feature rows with every stage in one Python process (tests,
notebooks, debugging), through the engine's local backend (:mod:`adjcap.engine`): the same decode
function, pool batch class and Arrow transport the Ray job's pools run (``jobs/ray_backend.py``), the
models loaded once here by the same family loaders."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Sequence

from adjcap.engine import pools, stage_registry
from adjcap.config import Config
from adjcap.data.records import Record
from adjcap.engine import executor
from adjcap.engine.local import LocalExecutor
from adjcap.engine.transport import unpack
from adjcap.index import CaptionIndex, encode_shards_in_process, encoder_identity, ensure_index
from adjcap.index.lifecycle import search_corpus
from adjcap.index.nouns import ensure_nouns
from adjcap.models import roles
from adjcap.engine.stage_cache import StageCache, stage_counts


class Models(SimpleNamespace):
    """Every model family's loaded model, by family name (``models.retrieval``, ``models.captioner``,
    ...; the families are those of :mod:`adjcap.engine.stage_registry`)."""


def load_models(cfg: Config, benchmark: str | None = None, corpus=None) -> Models:
    """Every family's models in this process, and the corpus index (built here when missing). An edge
    of its own (tests, notebooks): ``cfg`` as loaded, resolved here. ``corpus``: the one retrieval
    searches when the caller has read it already (a job's run plan), else read here."""
    return _load_models(cfg.resolved(), benchmark, corpus)


def _load_models(cfg: Config, benchmark: str | None = None, corpus=None) -> Models:
    name = benchmark or cfg.benchmark
    bench = cfg.benchmark_cfg(name)
    if corpus is None:
        corpus = search_corpus(cfg.retrieval, bench, name, cfg.paths.cache_dir)
    families = stage_registry.families_of(stage_registry.names())
    # the retrieval encoder first: it encodes the corpus when the index is missing
    retrieval = roles.load_retrieval_encoder(cfg.retrieval.encoder, cfg.device)
    out = ensure_index(cfg.retrieval, cfg.paths.cache_dir, corpus, encode_shards_in_process(retrieval),
                       corpus_format=bench.corpus_format)
    index = CaptionIndex.load(out, device=cfg.device, encoder_id=encoder_identity(cfg.retrieval.encoder),
                              corpus_fingerprint=corpus.fingerprint)
    given = {"index": stage_registry.SearchIndex(index, corpus.texts)}
    if cfg.captioner.entities.mode == "frequency":  # stage 3's corpus nouns, tagged once, kept with the index
        try:
            given["nouns"] = ensure_nouns(out, corpus.texts, corpus.fingerprint, cfg.captioner.entities.tagger)
        except (LookupError, OSError):  # e.g. no NLTK data: stage 3 reports it per image
            given["nouns"] = None
    loaded = stage_registry.load_families(cfg, [f for f in families if f != "retrieval"],
                                          given=given, preloaded={"retrieval": retrieval})
    return Models(**loaded)


def run_pipeline(records: Sequence[Record], cfg: Config, models: Models | None = None,
                 benchmark: str | None = None, batch_size: int | None = None,
                 stage_cache: StageCache | None = None, counts: dict[str, int] | None = None) -> list[dict[str, Any]]:
    """Records -> feature rows (docs/architecture.md, "Data flow of one image"), one per record, in
    record order: the engine's local backend (:class:`adjcap.engine.local.LocalExecutor`) runs the
    stages as one fused pool, the batches handed on as the transport's Arrow tables, as on Ray. With a
    ``stage_cache`` stored stage outputs are reused and new ones stored; ``counts`` (when given)
    accumulates the images each stage processed. A batch size halved out of GPU memory carries to the
    call's next batches (:class:`adjcap.engine.stages.HalvedSizes`). An edge of its own (tests, notebooks):
    ``cfg`` as loaded, resolved here."""
    cfg = cfg.resolved()
    benchmark = benchmark or cfg.benchmark
    models = models or _load_models(cfg, benchmark)
    gpu = str(cfg.device).startswith("cuda")
    bs = batch_size or pools.batch_size(cfg, pools.FUSED, gpu)
    found = stage_cache.lookup(r.image_id for r in records if not r.error) if stage_cache is not None else {}
    stream = executor.stream(cfg, records, found, executor.fused(cfg), gpu, benchmark=benchmark, batch_size=bs)
    rows: list[dict[str, Any]] = []
    for table in LocalExecutor(vars(models)).run(stream):
        states = unpack(table)
        if stage_cache is not None:
            stage_cache.store(states)
        if counts is not None:
            for stage, n in stage_counts(states).items():
                counts[stage] = counts.get(stage, 0) + n
        rows.extend(s.to_row() for s in states)
    return rows

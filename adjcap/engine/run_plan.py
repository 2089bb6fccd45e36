"""A job's run plan (docs/architecture.md, "Run plan"): everything a run is decided by, built once at
the edge (``adjcap run-job``, ``adjcap.run``, the caption job, each row of ``reproduce``) and passed
down read-only: the config as given and resolved, the benchmark's records, the corpus retrieval
searches (read once) and the searched index's identity, every stage's settings and identity, the pool
plan and the run directory. Nothing below the edge resolves the config or reads the corpus again."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from adjcap.engine.cluster_plan import PoolPlan
from adjcap.engine import stage_registry
from adjcap.config import Config
from adjcap.data.benchmarks import read_benchmark, split_annotations
from adjcap.data.corpus import Corpus
from adjcap.data.records import Record
from adjcap.engine.identity import flat_identity, identities_of, searched_index, stage_settings
from adjcap.index.lifecycle import encoder_identity, index_location, search_corpus
from adjcap.storage.rundir import RunDir
from adjcap.engine.stage_cache import StageCache


def read_records(cfg: Config) -> dict[str, list[Record]]:
    """Every configured split's records (``cfg`` resolved)."""
    b = cfg.benchmark_cfg(cfg.benchmark)
    out = {}
    for split in cfg.splits:
        ann = split_annotations(b, split, cfg.benchmark)
        out[split] = sample_records(read_benchmark(b.format, ann, b.images, split, limit=cfg.limit), cfg.sample,
                                    f"{cfg.seed}:{split}")
    return out


def sample_records(records: list[Record], n: int | None, seed: str) -> list[Record]:
    """``n`` of ``records`` drawn by ``seed`` (a string: the same draw on every machine), in their order."""
    import random

    if n is None or n >= len(records):
        return records
    keep = sorted(random.Random(seed).sample(range(len(records)), n))
    return [records[i] for i in keep]


def default_run_dir(cfg: Config) -> RunDir:
    """``<runs_dir>/<preset>-<benchmark>`` of a resolved config: where a run goes without --run-dir."""
    return RunDir.default_for(cfg.paths.runs_dir, cfg.name, cfg.benchmark)


@dataclass(frozen=True)
class RunPlan:
    """One job's decisions, read-only. ``given``: the config as the user gave it (placeholders kept:
    what config.toml records); ``cfg``: resolved (what everything below reads)."""

    given: Config
    cfg: Config
    records: Mapping[str, tuple[Record, ...]]
    corpus: Corpus
    index: str  # the searched index by content (encoder, corpus, precision)
    index_path: Path
    stage_settings: Mapping[str, Mapping[str, Any]]
    stages: Mapping[str, str]  # stage -> identity
    pools: PoolPlan  # the one source of the job's pools: layout, actors, batch sizes, environments, resources
    run: RunDir

    @classmethod
    def build(cls, given: Config, resolved: Config, run_dir: str | Path | RunDir | None = None) -> "RunPlan":
        """The plan of ``given`` (``resolved`` is ``given.resolved()``, done by the edge, which checks it
        first): records and corpus read here, once. Bad annotations or a missing corpus fail here,
        before anything is written."""
        cfg = resolved
        records = read_records(cfg)
        corpus = search_corpus(cfg.retrieval, cfg.benchmark_cfg(), cfg.benchmark, cfg.paths.cache_dir)
        settings = stage_settings(cfg, corpus.fingerprint)
        where = index_location(cfg.retrieval, cfg.paths.cache_dir, encoder_identity(cfg.retrieval.encoder),
                               corpus.fingerprint)
        run = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir) if run_dir else default_run_dir(cfg)
        if cfg.ray.prepare_pixels:  # the models' pixel geometries found out here, once, not while images stream
            stage_registry.pixel_preps(cfg, stage_registry.names())  # (remembered: adjcap.engine.pixel_memo)
        return cls(
            given=given, cfg=cfg,
            records=MappingProxyType({split: tuple(recs) for split, recs in records.items()}),
            corpus=corpus, index=searched_index(cfg, corpus.fingerprint), index_path=where,
            stage_settings=MappingProxyType({s: MappingProxyType(d) for s, d in settings.items()}),
            stages=MappingProxyType(identities_of(settings)),
            pools=PoolPlan.of(cfg), run=run,
        )

    @property
    def identity(self) -> dict[str, Any]:
        """The run identity (:func:`adjcap.engine.identity.run_identity`): what the run directory records and
        compares on resume."""
        return flat_identity({s: dict(d) for s, d in self.stage_settings.items()})

    def stage_cache(self) -> StageCache | None:
        """The stage cache of this run's identities (None unless ``cache.share_stages``)."""
        if not self.cfg.cache.share_stages:
            return None
        return StageCache(Path(self.cfg.cache.stages_dir), self.stages,
                          {s: dict(d) for s, d in self.stage_settings.items()},
                          rows_per_part=self.cfg.ray.rows_per_part)

"""The main job, ``adjcap run-job BENCHMARK``: extract features (Ray pools) -> fit and predict ->
evaluate -> report, all in one run directory (:class:`adjcap.rundir.RunDir`)."""

from __future__ import annotations

from pathlib import Path

from adjcap.config import Config
from adjcap.rundir import RunDir
from jobs import evaluate, fit, run_benchmark
from jobs.ray_session import ray_session


def run_dir_for(cfg: Config, run_dir: str | Path | None) -> RunDir:
    return RunDir(run_dir) if run_dir else RunDir.default_for(cfg.paths.runs_dir, cfg.name, cfg.benchmark)


def main(cfg: Config, run_dir: str | Path | None = None, resume: bool = True, evaluate_after: bool = True) -> RunDir:
    """``cfg`` as the user gave it (placeholders kept: it is what config.toml records)."""
    run = run_dir_for(cfg, run_dir)
    rcfg = cfg.resolved()
    records = run_benchmark.read_records(rcfg)  # bad annotations fail before anything is written
    with run.lock():
        run.check_identity(cfg.feature_identity(), fresh=not resume)
        run.write_config(cfg.to_toml())
        run_benchmark.write_references(run, rcfg.benchmark, records)
        with ray_session(rcfg):
            run_benchmark.main(rcfg, run, records, resume=resume)
            if evaluate_after:
                fit.main(rcfg, run)
        if evaluate_after:
            finish(cfg, rcfg, run, records)
    print("outputs: features/, predictions/, metrics/, report.md, report.html in")
    print(run.path)
    return run


def finish(cfg: Config, rcfg: Config, run: RunDir, records: dict) -> None:
    """Evaluate and report (when the benchmark has references)."""
    if any(r.references for recs in records.values() for r in recs):
        evaluate.evaluate_run_dir(rcfg.eval, rcfg.paths.cache_dir, run)
        evaluate.report([run.path], None)
    else:  # the user's own images: captions, but nothing to score them against
        print(f"no reference captions for {cfg.benchmark}: predictions written, metrics and report skipped")

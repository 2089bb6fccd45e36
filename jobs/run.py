"""The main job, ``adjcap run-job BENCHMARK``: extract features (Ray pools, or in process with
``executor = local``: :mod:`adjcap.jobs.executors`) -> fit and predict ->
evaluate -> report, all in one run directory (:class:`adjcap.storage.rundir.RunDir`)."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from adjcap.config import Config
from adjcap.storage.rundir import RunDir
from adjcap.engine.run_plan import RunPlan
from adjcap.report.tracking import log_run, parse_log_specs
from adjcap.jobs import evaluate, failures, fit, preflight, extract_features
from adjcap.jobs.provenance_record import recorded
from adjcap.jobs.executors import job_session, on_ray


def main(cfg: Config, run_dir: str | Path | None = None, resume: bool = True, evaluate_after: bool = True,
         log: Sequence[str] = (), summary: bool = True, heads_dir: str | Path | None = None,
         strict: bool = False) -> RunDir:
    """``cfg`` as the user gave it (placeholders kept: it is what config.toml records). ``log``:
    experiment trackers to log the finished run to (``mlflow[=URI]``, ``wandb[=PROJECT]``). ``summary``:
    end with the list of what was written (a caller that writes more prints its own). The edge: the
    config is resolved here, once, and the run plan built from it (:func:`plan_run`). ``heads_dir``:
    apply the heads another run fitted (its ``heads/``) instead of fitting (``adjcap fit --heads``).
    ``strict``: failed images end the job with :class:`adjcap.jobs.failures.ImagesFailed` once
    everything is written (the command line's exit code), else with the summary line printed."""
    trackers = parse_log_specs(log)  # a bad --log fails before anything runs
    plan = plan_run(cfg, cfg.resolved(), run_dir, evaluates=evaluate_after)
    return execute(plan, resume=resume, evaluate_after=evaluate_after, trackers=trackers, summary=summary,
                   heads_dir=heads_dir, strict=strict)


def plan_run(cfg: Config, rcfg: Config, run_dir: str | Path | RunDir | None = None,
             evaluates: bool = True) -> RunPlan:
    """The run plan of ``cfg`` (resolved: ``rcfg``), after the preflight: missing weights/data (Java when
    the job ``evaluates``) or a memory plan that cannot fit are refused before Ray starts and before
    anything is read or written."""
    preflight.check(rcfg, evaluates)
    return RunPlan.build(cfg, rcfg, run_dir)  # bad annotations fail here, before anything is written


def execute(plan: RunPlan, resume: bool = True, evaluate_after: bool = True, trackers: Sequence = (),
            summary: bool = True, heads_dir: str | Path | None = None, strict: bool = False) -> RunDir:
    """Run a planned job: features -> fit and predict -> evaluate -> report, in the plan's run directory.
    ``trackers``: :func:`adjcap.report.tracking.parse_log_specs`' output; ``heads_dir``, ``strict``: as :func:`main`'s.
    Failed images: :mod:`adjcap.jobs.failures` (too many stop the job before fitting)."""
    started = time.time_ns()
    run, rcfg = plan.run, plan.cfg
    scored = False
    with run.lock():
        run.check_identity(plan.identity, fresh=not resume)
        run.write_config(plan.given.to_toml())
        extract_features.write_references(run, rcfg.benchmark, plan.records)
        with recorded(plan) as prov:
            with job_session(rcfg):
                if on_ray(rcfg):
                    prov.add_cluster()
                extract_features.main(plan, resume=resume)
                if evaluate_after:
                    fit.main(rcfg, run, heads_dir=heads_dir)
            if evaluate_after:
                scored = evaluate_and_tabulate(rcfg, run, plan.records)
        if evaluate_after and scored:  # rendered from the finished results (provenance.json complete)
            evaluate.report([run.path], None)
        if trackers:
            log_run(trackers, run)
    if summary:
        print_written(run, started)
    failures.report(run, rcfg.benchmark, plan.records, strict)
    return run


def written_since(run: RunDir, since_ns: int) -> list[str]:
    """The run directory's entries written since ``since_ns`` (``time.time_ns()``): its files, and its
    folders (``name/``) holding a file written since then. The run lock is no output."""
    since = since_ns - 50_000_000  # file times come from a coarser clock than time.time_ns()
    out: set[str] = set()
    for p in run.path.rglob("*"):
        rel = p.relative_to(run.path)
        if p == run.lock_path or any(part.startswith(".") for part in rel.parts) or not p.is_file():
            continue
        if p.stat().st_mtime_ns >= since:
            out.add(f"{rel.parts[0]}/" if len(rel.parts) > 1 else rel.parts[0])
    return sorted(out, key=lambda n: (n.endswith("/"), n))


def print_written(run: RunDir, since_ns: int) -> None:
    """The summary's last lines: exactly what this command wrote in the run directory, then its path."""
    print("written: " + (", ".join(written_since(run, since_ns)) or "nothing new") + " in")
    print(run.path)


def evaluate_and_tabulate(rcfg: Config, run: RunDir, records: Mapping) -> bool:
    """Evaluate (when the benchmark has references) and write the per-sample table; True when
    there are metrics to report."""
    scored = any(r.references for recs in records.values() for r in recs)
    if scored:
        evaluate.evaluate_run_dir(rcfg.eval, rcfg.paths.cache_dir, run)
    else:  # the user's own images: captions, but nothing to score them against
        print(f"no reference captions for {rcfg.benchmark}: predictions and samples.parquet written, "
              "metrics and report skipped")
    evaluate.write_samples(rcfg, run, records)
    return scored


def finish(rcfg: Config, run: RunDir, records: Mapping) -> None:
    """Evaluate, write the per-sample table and (when scored) the report: what run-job does after
    fitting, for callers outside a recorded run (no provenance to wait for)."""
    if evaluate_and_tabulate(rcfg, run, records):
        evaluate.report([run.path], None)

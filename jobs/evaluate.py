"""Evaluation and reports: score a run's predictions or any COCO results file, write reports."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from adjcap.storage import samples
from adjcap.config import Config, EvalCfg
from adjcap.metrics.evaluate import evaluate_predictions, format_table
from adjcap.metrics.run_metrics import evaluate_run
from adjcap.report import write_report
from adjcap.report.compare import compare as compare_runs, to_text
from adjcap.storage.rundir import RunDir
from adjcap.jobs.provenance_record import note_step


def evaluate_run_dir(eval_cfg: EvalCfg, cache_dir: str | Path, run: RunDir, intersection: bool = False) -> dict:
    """Score every predictions file of a run (``eval_cfg`` resolved); print one table per picker."""
    out = evaluate_run(run, eval_cfg=eval_cfg, cache_dir=cache_dir,
                       on_missing="intersection" if intersection else "error")
    for proto, doc in out.items():
        for picker, res in doc["pickers"].items():
            print(f"[{proto} / {picker}]")
            print(format_table(res))
    return out


def evaluate_saved_run(cfg: Config, run: RunDir, intersection: bool = False) -> dict:
    """``adjcap evaluate --run DIR``: the run's own config (resolved), with the caller's eval settings;
    the per-sample table is rewritten with the new metrics."""
    out = evaluate_run_dir(cfg.eval, cfg.paths.cache_dir, run, intersection=intersection)
    note_step(run, "evaluate")
    write_samples(cfg, run)
    return out


def write_samples(cfg: Config, run: RunDir, records: Mapping | None = None) -> Path:
    """``samples.parquet`` and ``samples.md`` of a run (``cfg`` resolved); ``records``: the benchmark's
    records as the job read them (their image paths), default: read again (none when unreadable)."""
    if records is None:
        from adjcap.engine.run_plan import read_records

        try:
            records = read_records(cfg)
        except Exception:  # noqa: BLE001 - the table is still written, its image paths from the last one
            records = {}
    paths = {(split, r.image_id): r.image_path for split, recs in records.items() for r in recs}
    root = cfg.benchmark_cfg().images if cfg.benchmark in cfg.benchmarks else None
    out = samples.write_samples(run, paths, image_root=root)
    print(f"samples: {out} ({run.samples_card_path.name} describes its fields)")
    return out


def evaluate_file(eval_cfg: EvalCfg, predictions: Path, references: Path, fmt: str, split: str | None,
                  out: Path | None, intersection: bool = False) -> dict:
    """``adjcap evaluate --predictions P --references R``."""
    result = evaluate_predictions(predictions, references, fmt=fmt, split=split, spice_cfg=eval_cfg, out=out,
                                  on_missing="intersection" if intersection else "error")
    print(format_table(result))
    if out:
        print(f"metrics written to {out}")
    return result


def report(runs: list[Path], out: Path | None, baseline: Path | None = None) -> dict:
    written = write_report([Path(r) for r in runs], out, baseline=baseline)
    print(f"report: {written['markdown']}")
    print(f"gallery: {written['html']}")
    return written


def compare(runs: list[Path], out: Path | None, intersection: bool = False) -> dict:
    """``adjcap compare RUN_A RUN_B [...]``: print each comparison, write compare.md / compare.html."""
    comparisons, written = compare_runs([Path(r) for r in runs], out, intersection=intersection)
    for c in comparisons:
        print(to_text(c))
    print(f"compare: {written['markdown']}")
    print(f"compare: {written['html']}")
    return written

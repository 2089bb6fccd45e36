"""Evaluation and reports: score a run's predictions or any COCO results file, write reports."""

from __future__ import annotations

from pathlib import Path

from adjcap.config import Config, EvalCfg
from adjcap.metrics.evaluate import evaluate_predictions, evaluate_run, format_table
from adjcap.report import write_report
from adjcap.rundir import RunDir


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
    """``adjcap evaluate --run DIR``: the run's own config, with the caller's eval settings."""
    cfg = cfg.resolved()
    return evaluate_run_dir(cfg.eval, cfg.paths.cache_dir, run, intersection=intersection)


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

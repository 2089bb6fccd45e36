"""Evaluation and reports: score a run's predictions or any COCO results file, write reports."""

from __future__ import annotations

from pathlib import Path

from adjcap.config import Config


def evaluate_run_dir(cfg: Config, run_dir: Path) -> dict:
    from adjcap.metrics.evaluate import evaluate_run, format_table

    out = evaluate_run(run_dir, eval_cfg=cfg.eval, cache_dir=cfg.cache_dir)
    for proto, doc in out.items():
        for picker, res in doc["pickers"].items():
            print(f"[{proto} / {picker}]")
            print(format_table(res))
    return out


def main(*, run: Path | None, predictions: Path | None, references: Path | None, fmt: str, split: str | None,
         out: Path | None, spice_jars: Path | None, spice: bool, intersection: bool = False) -> dict:
    from adjcap.config import EvalCfg
    from adjcap.metrics.evaluate import evaluate_predictions, format_table

    eval_cfg = EvalCfg(spice=spice, spice_jars=str(spice_jars) if spice_jars else None)
    if run is not None:
        from adjcap.config import load_config

        cfg = load_config(config_file=run / "config.toml")
        cfg.eval.spice = spice
        if spice_jars:
            cfg.eval.spice_jars = str(spice_jars)
        return evaluate_run_dir(cfg, run)
    if predictions is None or references is None:
        raise ValueError("give --run DIR, or --predictions PRED.json with --references REFS")
    result = evaluate_predictions(predictions, references, fmt=fmt, split=split, spice_cfg=eval_cfg, out=out,
                                  on_missing="intersection" if intersection else "error")
    print(format_table(result))
    if out:
        print(f"metrics written to {out}")
    return result


def report(runs: list[Path], out: Path | None) -> dict:
    from adjcap.report import write_report

    written = write_report([Path(r) for r in runs], out)
    print(f"report: {written['markdown']}")
    print(f"gallery: {written['html']}")
    return written

"""``adjcap reproduce TABLE``: every row of one of the paper's tables as one Ray job (one Ray session
for the whole table), each row's run directory written as ``run-job`` writes it, then the table
with the paper's published values beside the measured ones (Markdown, LaTeX, HTML).

Rows share their work: rows of one run directory (the same preset read at other pickers) run once,
and rows that agree up to a stage reuse its outputs from the stage cache (``cache.share_stages``).
A row whose preset is missing or whose run fails is shown as such; the other rows still run. A row
with ``heads_from`` (tables.toml) runs after the row it names and applies that run's heads frozen."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from adjcap.storage.io import atomic_write_json, atomic_write_text
from adjcap.report.collect import load_run
from adjcap.report.page import table_page
from adjcap.report.reproduced import RowResult, build_table, paired_intervals
from adjcap.report.seeds import reproduced_seeds_table
from adjcap.report.tables import Table
from adjcap.reproduce import TableDef, distinct_runs, get_table, plan_table
from adjcap.reproduce.plan import DEMO, RowPlan
from adjcap.storage.rundir import RunDir
from adjcap.engine import stage_registry
from adjcap.jobs import preflight, run
from adjcap.jobs.executors import job_session


def _measure(plan: RowPlan, failed: dict[Path, str]) -> RowResult:
    res = RowResult(plan.row, plan.benchmark, plan.protocol, plan.picker, run_dir=str(plan.run_dir or ""))
    if plan.cfg is not None:
        res.extra["encoder"] = plan.cfg.retrieval.encoder.model
    if plan.problem:
        res.status = plan.problem
        return res
    if plan.run_dir in failed:
        res.status = f"failed: {failed[plan.run_dir]}"
        return res
    data = load_run(plan.run_dir)
    res.metrics = data.picker_metrics(plan.protocol, plan.picker) or None
    corpus = RunDir(plan.run_dir).summary().get("corpus")
    if res.metrics is not None and corpus:  # the corpus retrieval searched: its size, its overlap (columns "corpus.*")
        res.metrics = {**res.metrics, "corpus": corpus}
        if plan.cfg is not None and plan.cfg.retrieval.corpus:
            res.extra["corpus"] = plan.cfg.retrieval.corpus
    study = data.metrics.get(plan.protocol, {}).get("seeds", {}).get("pickers", {}).get(plan.picker)
    if study:  # --seeds: this row's pick was fitted once per seed
        res.extra["seeds"] = study
    if res.metrics is None:
        res.status = "not evaluated"
    return res


def stage_work(plans: list[RowPlan]) -> dict[str, dict[str, int]]:
    """Images each stage processed and reused, and the seconds spent extracting features (model
    loading included), summed over the table's runs (features/summary.json)."""
    names = stage_registry.names()
    out: dict[str, Any] = {"computed": {s: 0 for s in names}, "reused": {s: 0 for s in names}}
    seconds = 0.0
    for p in distinct_runs(plans):
        summary = RunDir(p.run_dir).summary()
        seconds += float(summary.get("seconds", 0.0))
        stages = summary.get("stages", {})
        for kind in out:
            for s, n in stages.get(kind, {}).items():
                out[kind][s] = out[kind].get(s, 0) + int(n)
    out["extract_seconds"] = round(seconds, 1)
    return out


def long_candidates(runs: list, failed: dict) -> dict[str, Any]:
    """For rows captioned by a vision-language model: each run's candidates the judge cuts
    (:mod:`adjcap.models.judge_window`) and the images of a seeded sample (``sample``), per split."""
    from adjcap.models.judge_window import cut_count
    from adjcap.engine.run_plan import read_records
    from adjcap.storage.samples import candidates_of, read_samples

    cut, sample = [], {}
    for p in runs:
        if p.resolved.captioner.family != "vlm" or p.run_dir in failed or not Path(p.run_dir).is_dir():
            continue  # read_samples builds the table from the run's files when samples.parquet is not there
        texts = [t for row in candidates_of(read_samples(RunDir(p.run_dir))) for t in row["candidates"]]
        cut.append({"run": Path(p.run_dir).name, **cut_count(texts, p.resolved.verifier)})
        if p.resolved.sample and not sample:
            sample = {split: [r.image_id for r in recs] for split, recs in read_records(p.resolved).items()}
    return {**({"cut_candidates": cut} if cut else {}), **({"sample_ids": sample} if sample else {})}


def _prepare_demo(runs: list[RowPlan]) -> None:
    """The demo world and, per row, a second captioner family's tiny model and the tiny judge of its verifier."""
    if not any(p.benchmark == DEMO for p in runs):
        return
    from adjcap.jobs import demo

    demo.prepare(runs[0].cfg)
    for p in runs:  # a second captioner family's tiny model and each row's tiny judge of its verifier
        demo.second_captioner(p.cfg, p.resolved)  # family, built on first use (not by `make demo`)
        if p.benchmark == DEMO:
            demo.tiny_judge(p.resolved)


def _preflight(runs: list[RowPlan]) -> dict[Path, str]:
    """Rows that cannot run here (run dir -> why), said before Ray starts; they are skipped."""
    failed: dict[Path, str] = {}
    for p in runs:
        why = preflight.problems(p.resolved)
        if why:
            failed[p.run_dir] = why
            print(f"row run {p.run_dir} skipped: {why}")
    return failed


def _run_rows(table: TableDef, ready: list[RowPlan], failed: dict[Path, str]) -> None:
    """Each ready row's run in one session (one Ray session for the table; none with ``executor = local``);
    a failing row is recorded in ``failed`` and the others run."""
    with job_session(ready[0].resolved):
        for i, p in enumerate(ready, 1):
            print(f"== {table.key} run {i}/{len(ready)}: {p.row.preset} on {p.benchmark} -> {p.run_dir}"
                  + (f" (heads of {p.heads_from.name})" if p.heads_from is not None else ""))
            if p.heads_from is not None and p.heads_from in failed:
                failed[p.run_dir] = f"its heads' run {p.heads_from.name} failed"
                continue
            try:  # each row's run plan, from its config resolved once (adjcap.reproduce.plan_table)
                run.execute(run.plan_run(p.cfg, p.resolved, p.run_dir),
                            heads_dir=RunDir(p.heads_from).heads_dir if p.heads_from is not None else None)
            except KeyboardInterrupt:
                raise
            except Exception as e:  # noqa: BLE001 - one failing row is reported in its cell, the others run
                msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                failed[p.run_dir] = msg
                print(f"row run {p.run_dir} failed: {msg}")


def _write_tables(out_dir: Path, stem: str, table: TableDef, tabs: list[Table]) -> dict[str, Path]:
    """The reproduced table (and the tables beside it) as Markdown, LaTeX and an HTML page."""
    return {
        "markdown": atomic_write_text(out_dir / f"{stem}.md", "\n".join(t.to_markdown() for t in tabs)),
        "latex": atomic_write_text(out_dir / f"{stem}.tex", "\n".join(t.to_latex() for t in tabs)),
        "html": atomic_write_text(out_dir / f"{stem}.html",
                                  table_page(tabs[0], f"adjcap reproduce {table.key}", extra=tabs[1:])),
    }


def _rows_document(table: TableDef, results: list[RowResult], out_table: Table) -> list[dict[str, Any]]:
    return [{"label": r.row.label, "preset": r.row.preset, "protocol": r.protocol, "picker": r.picker,
             "status": r.status, "run_dir": r.run_dir,
             "measured": {c.header: v for c, v in zip(table.columns, out_table.rows[i][3::3])},
             **({"seeds": {k: v for k, v in r.extra["seeds"].items()}} if r.extra.get("seeds") else {})}
            for i, r in enumerate(results)]


def _print_summary(tabs: list[Table], doc: dict[str, Any], paths: dict[str, Path]) -> None:
    """The tables, the candidates a judge cut, the paired differences and the stage work, on the console."""
    for t in tabs:
        print(t.to_markdown())
    for c in doc.get("cut_candidates", []):
        print(f"{c['run']}: the {c['judge']} judge cut {c['cut']} of {c['candidates']} candidates "
              f"(window {c['window']} tokens: {c['how']})")
    for d in doc["paired_differences"]:
        print(f"{d['label']}: {d.get('metric', 'CIDEr')} {d['delta']:+.1f} [{d['low']:+.1f}, {d['high']:+.1f}] (95% paired bootstrap over "
              f"{d['images']} images{', excludes zero' if d['excludes_zero'] else ''})")
    work = doc["stage_work"]
    print("stage work (images): computed " + ", ".join(f"{k} {v}" for k, v in work["computed"].items())
          + "; reused " + ", ".join(f"{k} {v}" for k, v in work["reused"].items()))
    print(f"table: {paths['markdown']} (.tex, .html, .json beside it)")


def main(table_key: str | TableDef, benchmark: str | None = None, sets: list[str] | tuple[str, ...] = (),
         updates: dict[str, Any] | None = None, runs_dir: str | Path | None = None) -> dict[str, Any]:
    """``table_key``: a table of tables.toml, or a parsed definition (:func:`adjcap.reproduce.parse_tables`)."""
    table = get_table(table_key) if isinstance(table_key, str) else table_key
    plans = plan_table(table, benchmark, sets, updates, runs_dir)
    for p in plans:
        if p.problem:
            print(f"row '{p.row.label}': {p.problem}; shown as n/a (adjcap reproduce --list)")
    runs = distinct_runs(plans)
    t0 = time.time()
    _prepare_demo(runs)
    failed = _preflight(runs)
    ready = [p for p in runs if p.run_dir not in failed]
    if ready:
        _run_rows(table, ready, failed)
    results = [_measure(p, failed) for p in plans]
    bench = benchmark or table.benchmark
    out_table = build_table(table, results, benchmark)
    tabs = [out_table, *(t for t in (reproduced_seeds_table(results),) if t is not None)]
    root = Path(runs_dir) if runs_dir else Path(runs[0].cfg.paths.runs_dir if runs else "runs")
    out_dir = root / "reproduce"
    stem = f"{table.key}-{bench}"
    paths = _write_tables(out_dir, stem, table, tabs)
    work = stage_work(plans)
    paired = paired_intervals(table, results)
    doc = {"table": table.key, "benchmark": bench, "seconds": time.time() - t0,
           "rows": _rows_document(table, results, out_table), "stage_work": work, "paired_differences": paired,
           "runs": len(runs)}
    doc.update(long_candidates(runs, failed))
    paths["json"] = atomic_write_json(out_dir / f"{stem}.json", doc)
    _print_summary(tabs, doc, paths)
    return {"paths": {k: str(v) for k, v in paths.items()}, **json.loads(json.dumps(doc, default=str))}

"""A reproduced table: each row's measured values beside the paper's published ones and the
difference (measured - published), as an :class:`adjcap.report.tables.Table` (Markdown, LaTeX, HTML)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from adjcap.report.published import load_published
from adjcap.report.tables import Table
from adjcap.reproduce.tables import Column, Row, TableDef


@dataclass
class RowResult:
    """What one row measured: the pick's metrics (``pickers.<picker>`` of metrics/<protocol>.json),
    or why there is nothing (preset missing, run failed, picker not evaluated)."""

    row: Row
    benchmark: str
    protocol: str | None = None
    picker: str | None = None
    metrics: dict[str, Any] | None = None
    status: str = "ok"
    run_dir: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def lookup(doc: Mapping[str, Any] | None, path: str) -> Any:
    """A dotted path in nested dicts; None when any step is absent."""
    cur: Any = doc
    for part in path.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return None
        cur = cur[part]
    return cur


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return None if isinstance(v, float) and math.isnan(v) else float(v)


def published_row(table: TableDef, row: Row) -> dict[str, Any] | None:
    """The row's entry in published.json (None when the table or the row has none)."""
    match = {"name": row.label} if row.match is None else row.match
    if not table.published or not match:
        return None
    rows = load_published()["tables"].get(table.published, {}).get("rows", [])
    for r in rows:
        if all(r.get(k) == v for k, v in match.items()):
            return r
    return None


def published_value(table: TableDef, row: Row, col: Column) -> float | None:
    if col.header in row.published_values:
        return float(row.published_values[col.header])
    if not col.published:
        return None
    return _number(lookup(published_row(table, row), col.published.format(**row.vars)))


def measured_value(res: RowResult, col: Column) -> float | None:
    return _number(lookup(res.metrics, col.measured.format(**res.row.vars))) if res.metrics else None


NOT_PUBLISHED = "not published"  # the paper cell of a row the paper has no number for (tables.toml: match = {})


def _delta(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def row_label(res: RowResult, table: TableDef) -> str:
    """The row's label, with the retrieval encoder the run actually used when the row was run away
    from its paper benchmark (the demo world maps every encoder onto a tiny one)."""
    enc, corpus = res.extra.get("encoder"), res.extra.get("corpus")
    if enc and res.benchmark != (res.row.benchmark or table.benchmark) and enc not in res.row.label:
        return f"{res.row.label} [run with {enc}" + (f", corpus {corpus}]" if corpus else "]")
    return res.row.label


def build_table(table: TableDef, results: list[RowResult], benchmark: str | None = None) -> Table:
    """One line per row: label, preset, protocol / picker, then per column: measured, paper, delta.
    Published values are shown only for rows run on the paper's benchmark for them (the demo world
    has none: its published cells read n/a)."""
    headers = ["row", "preset", "protocol / picker"]
    digits: dict[int, int] = {}
    for c in table.columns:
        base = len(headers)
        headers += [c.header, "paper", "\u0394"]
        if c.digits is not None:
            for k in range(3):
                digits[base + k] = c.digits
    title = f"{table.title} [{table.label}]" if table.label else table.title
    if benchmark and benchmark != table.benchmark:
        # what was run leads: the paper's table only names the rows (the demo world is not COCO)
        title = f"{benchmark}: the rows of the paper's '{title}', re-run on {benchmark} (nothing published for it)"
    else:
        title = f"{title}: measured{f' on {benchmark}' if benchmark else ''} vs published"
    out = Table(title=title, columns=headers, label=f"{table.label or table.key}-reproduced",
                caption="measured = this reproduction (x100 except counts and CLIPScore); paper = the published value; "
                "\u0394 = measured - paper; n/a = not measured or not published for this benchmark.",
                digits=digits)
    by_label: dict[str, RowResult] = {}
    for res in results:
        row = res.row
        show_pub = res.benchmark == (row.benchmark or table.benchmark)
        what = " / ".join(x for x in (res.protocol, res.picker) if x)
        cells: list[Any] = [row_label(res, table), row.preset,
                            what if res.status == "ok" else f"{what} ({res.status})".strip()]
        unpublished = show_pub and row.match == {} and not row.published_values
        for c in table.columns:
            m = measured_value(res, c)
            p = published_value(table, row, c) if show_pub else None
            cells += [m, NOT_PUBLISHED if unpublished else p, _delta(m, p)]
        out.rows.append(cells)
        by_label[row.label] = res
    for i, d in enumerate(table.differences):
        a, b = by_label.get(d.minuend), by_label.get(d.subtrahend)
        if a is None or b is None:
            continue
        if i == 0:
            out.rules.add(len(out.rows))
        show_pub = a.benchmark == (a.row.benchmark or table.benchmark)
        cells = [d.label, "", "difference"]
        for c in table.columns:
            m = _delta(measured_value(a, c), measured_value(b, c))
            p = float(d.published_values[c.header]) if show_pub and c.header in d.published_values else None
            if p is None and show_pub:
                p = _delta(published_value(table, a.row, c), published_value(table, b.row, c))
            cells += [m, p, _delta(m, p)]
        out.rows.append(cells)
    return out


def paired_intervals(table: TableDef, results: list[RowResult]) -> list[dict[str, Any]]:
    """The table's differences whose subtrahend is an LM-only pick: the minuend's CIDEr minus the LM-only
    pick of the minuend's own run and protocol (the same beams, on the same images: as the run's report
    pairs them, :func:`adjcap.report.headline.picker_differences`), with its 95% paired bootstrap interval;
    a subtrahend of another run (the LVLM table's greedy rows): every metric of
    :func:`adjcap.report.paired_runs.paired_across`, paired on the images both runs scored."""
    from pathlib import Path

    from adjcap.report.collect import LM_PICKER, load_run
    from adjcap.report.headline import picker_differences

    by_label = {r.row.label: r for r in results}
    out = []
    for d in table.differences:
        a, b = by_label.get(d.minuend), by_label.get(d.subtrahend)
        if a is None or b is None or a.status != "ok" or not a.run_dir or not Path(a.run_dir).is_dir():
            continue
        if b.run_dir != a.run_dir:  # another run's pick (greedy decoding): paired on the images both have
            from adjcap.report.paired_runs import as_rows, paired_across

            if b.status == "ok" and b.run_dir and Path(b.run_dir).is_dir():
                diffs = paired_across(load_run(a.run_dir), a.protocol, a.picker, load_run(b.run_dir), b.protocol,
                                      b.picker)
                out += as_rows(d.label, diffs, run_dir=a.run_dir, protocol=a.protocol, against=b.run_dir)
            continue
        if b.picker != LM_PICKER:
            continue
        diff = picker_differences(load_run(a.run_dir), a.protocol, a.picker).get("CIDEr")
        if diff is not None:
            out.append({"label": d.label, "metric": "CIDEr", "delta": diff.delta, "low": diff.low, "high": diff.high,
                        "excludes_zero": bool(diff.excludes_zero), "images": int(diff.n_images),
                        "run_dir": a.run_dir, "protocol": a.protocol})
    return out

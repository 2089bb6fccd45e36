"""The paper's tables as data (``tables.toml`` beside this file): a registry of table definitions,
each with its rows (a preset + overrides run on a benchmark, read at one protocol / picker) and its
columns (where a measured value sits in a pick's metrics, where the published one sits in
``adjcap/report/resources/published.json``)."""

from __future__ import annotations

import functools
import hashlib
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Callable

from adjcap.config import ConfigError, list_presets, load_config
from adjcap.registry import lookup


@dataclass(frozen=True)
class Column:
    header: str
    measured: str  # dotted path in pickers.<picker> of metrics/<protocol>.json; may use {var}
    published: str | None = None  # dotted path in the published row; may use {var}
    digits: int | None = None


@dataclass(frozen=True)
class Row:
    label: str
    preset: str
    sets: tuple[str, ...] = ()
    benchmark: str | None = None  # None: the table's
    protocol: str | None = None  # None: the preset's rerank.protocol
    picker: str | None = None  # None: the preset's rerank.picker
    match: dict[str, Any] | None = None  # selects the published row; None: {name: label}
    published_values: dict[str, float] = field(default_factory=dict)  # column header -> value
    vars: dict[str, str] = field(default_factory=dict)
    # the label of another row of the table whose run's heads this row applies frozen (not fitted here:
    # e.g. COCO-val heads on NoCaps); that row runs first
    heads_from: str | None = None

    @property
    def run_key(self) -> str:
        """Rows with equal keys are one run (same preset, overrides, benchmark and heads' row)."""
        slug = hashlib.sha256("\n".join(self.sets).encode()).hexdigest()[:8] if self.sets else ""
        key = f"{self.preset}-{slug}" if slug else self.preset
        if self.heads_from:
            key += f"-heads{hashlib.sha256(self.heads_from.encode()).hexdigest()[:8]}"
        return key


@dataclass(frozen=True)
class Difference:
    """A derived row: measured(minuend) - measured(subtrahend), beside a published difference."""

    label: str
    minuend: str
    subtrahend: str
    published_values: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class TableDef:
    key: str
    title: str
    benchmark: str
    columns: tuple[Column, ...]
    rows: tuple[Row, ...]
    label: str = ""
    published: str | None = None  # table key in published.json
    differences: tuple[Difference, ...] = ()

    def presets(self) -> list[str]:
        return list(dict.fromkeys(r.preset for r in self.rows))

    def missing_presets(self) -> list[str]:
        known = set(list_presets())
        return [p for p in self.presets() if p not in known]


def _column(d: dict[str, Any], where: str) -> Column:
    try:
        return Column(header=str(d["header"]), measured=str(d["measured"]), published=d.get("published"),
                      digits=d.get("digits"))
    except KeyError as e:
        raise ConfigError(f"{where}: a column needs '{e.args[0]}'") from None


def _row(d: dict[str, Any], where: str) -> Row:
    unknown = set(d) - {"label", "preset", "set", "benchmark", "protocol", "picker", "match", "published_values", "vars",
                        "heads_from"}
    if unknown:
        raise ConfigError(f"{where}: unknown row keys {sorted(unknown)}")
    if "label" not in d or "preset" not in d:
        raise ConfigError(f"{where}: a row needs 'label' and 'preset'")
    return Row(label=str(d["label"]), preset=str(d["preset"]), sets=tuple(d.get("set", ())),
               benchmark=d.get("benchmark"), protocol=d.get("protocol"), picker=d.get("picker"),
               match=d.get("match"), published_values=dict(d.get("published_values", {})),
               vars={k: str(v) for k, v in d.get("vars", {}).items()}, heads_from=d.get("heads_from"))


def parse_tables(text: str, source: str = "tables.toml") -> dict[str, TableDef]:
    data = tomllib.loads(text)
    shared = data.get("columns", {})
    out: dict[str, TableDef] = {}
    for key, t in data.get("tables", {}).items():
        where = f"{source} [tables.{key}]"
        cols = t.get("columns", [])
        if isinstance(cols, str):
            if cols not in shared:
                raise ConfigError(f"{where}: columns = '{cols}' is not defined under [columns]")
            cols = shared[cols]
        rows = tuple(_row(r, f"{where} row {i + 1}") for i, r in enumerate(t.get("rows", [])))
        labels = [r.label for r in rows]
        by_label = {r.label: r for r in rows}
        for r in rows:
            if r.heads_from is None:
                continue
            src = by_label.get(r.heads_from)
            if src is None:
                raise ConfigError(f"{where}: row '{r.label}' takes its heads from '{r.heads_from}', which is no row "
                                  "of the table; name another row's label")
            if src.heads_from is not None:
                raise ConfigError(f"{where}: row '{r.label}' takes its heads from '{r.heads_from}', which takes its own "
                                  f"from '{src.heads_from}'; name the row that fits them")
        diffs = tuple(Difference(label=str(x["label"]), minuend=str(x["minuend"]), subtrahend=str(x["subtrahend"]),
                                 published_values=dict(x.get("published_values", {})))
                      for x in t.get("differences", []))
        for d in diffs:
            for name in (d.minuend, d.subtrahend):
                if name not in labels:
                    raise ConfigError(f"{where}: difference '{d.label}' names no row '{name}'")
        out[key] = TableDef(key=key, title=str(t.get("title", key)), benchmark=str(t["benchmark"]),
                            columns=tuple(_column(c, where) for c in cols), rows=rows, label=str(t.get("label", "")),
                            published=t.get("published"), differences=diffs)
    return out


@functools.lru_cache(maxsize=1)
def load_tables() -> dict[str, TableDef]:
    """The registry: table key -> definition, in the order of ``tables.toml``."""
    text = (resources.files("adjcap.reproduce") / "tables.toml").read_text(encoding="utf-8")
    return parse_tables(text)


def get_table(key: str) -> TableDef:
    return lookup(load_tables(), key, "table", ConfigError, see="adjcap reproduce --list")


def listing(status: Callable[[TableDef], str] | None = None) -> str:
    """``adjcap reproduce --list``: every table, its rows and the presets they run (missing presets said)
    and, with ``status`` (:func:`adjcap.reproduce.readiness.table_status`), a status line per table."""
    known = set(list_presets())
    defaults: dict[str, str] = {}
    lines = []
    for t in load_tables().values():
        missing = t.missing_presets()
        lines.append(f"{t.key}  {t.title} [{t.label or 'numbers from the paper text'}], {t.benchmark}; "
                     f"{len(t.rows)} rows, {len({r.run_key + (r.benchmark or t.benchmark) for r in t.rows})} runs"
                     + (f"; MISSING presets: {', '.join(missing)}" if missing else ""))
        if status is not None and not missing:
            lines.append(f"  status: {status(t)}")
        for r in t.rows:
            if r.preset in known and r.preset not in defaults:
                rr = load_config(r.preset).rerank
                defaults[r.preset] = f"{rr.protocol} / {rr.picker}"
            what = " / ".join(x for x in (r.protocol, r.picker) if x)
            if not (r.protocol and r.picker):
                d = defaults.get(r.preset, "? / ?").split(" / ")
                what = f"{r.protocol or d[0]} / {r.picker or d[1]}"
            extra = f" --set {' --set '.join(r.sets)}" if r.sets else ""
            extra += f" with the heads of '{r.heads_from}'" if r.heads_from else ""
            state = "" if r.preset in known else "   (preset missing)"
            lines.append(f"    {r.label:52s} {r.preset}{extra} on {r.benchmark or t.benchmark} ({what}){state}")
    return "\n".join(lines)

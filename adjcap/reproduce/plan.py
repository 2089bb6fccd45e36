"""From a table definition to the runs it needs: each row's config (preset + row overrides + the
caller's ``--set``, on the paper's benchmark or another one, the demo world's tiny models on
``demo``) and its run directory. Rows with the same preset, overrides and benchmark are one run. A
row with ``heads_from`` applies the heads of that row's run (its ``heads/``) instead of fitting, and
runs after it."""

from __future__ import annotations

import functools
import hashlib
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from adjcap.config import Config, ConfigError, apply_override, list_presets, load_config, set_key
from adjcap.reproduce.tables import Row, TableDef

DEMO = "demo"


@dataclass
class RowPlan:
    row: Row
    benchmark: str
    cfg: Config | None = None  # None when the row cannot run (``problem`` says why)
    resolved: Config | None = None  # ``cfg`` resolved, once, here (the row's own edge)
    run_dir: Path | None = None
    problem: str | None = None
    heads_from: Path | None = None  # the run directory whose heads/ this row applies (row.heads_from's run)

    @property
    def protocol(self) -> str | None:
        return self.row.protocol or (self.cfg.rerank.protocol if self.cfg else None)

    @property
    def picker(self) -> str | None:
        return self.row.picker or (self.cfg.rerank.picker if self.cfg else None)


@functools.lru_cache(maxsize=1)
def demo_mapping() -> dict[str, Any]:
    return tomllib.loads((resources.files("adjcap.reproduce") / "demo.toml").read_text(encoding="utf-8"))


def _is_encoder(d: Any) -> bool:
    return isinstance(d, dict) and {"model", "pretrained", "precision"} <= set(d)


def to_demo(data: dict[str, Any]) -> dict[str, Any]:
    """A config dict moved onto the demo world: every open_clip encoder becomes the large or small
    tiny CLIP (by its model name), a registered corpus the demo world's stand-in for it, the other models
    and sizes come from ``demo.toml`` (the verifier by its ``verifier.family``)."""
    m = demo_mapping()

    def walk(d: dict[str, Any]) -> None:
        for k, v in d.items():
            if k == "verifier":  # mapped by its family below (a clip-family verifier looks like an encoder)
                continue
            if _is_encoder(v):
                tiny = m["encoder"]["large" if v["model"] in m["large_models"] else "small"]
                v.update(tiny)
            elif isinstance(v, dict) and k != "benchmarks":
                walk(v)

    walk(data)
    corpus = data.get("retrieval", {}).get("corpus")
    if corpus is not None:  # another corpus: the demo world's own second one stands in
        data["retrieval"]["corpus"] = m["corpus"].get(corpus, corpus)
    for key, value in m["set"].items():
        set_key(data, key, value)
    for key, value in m.get("verifier", {}).get(data["verifier"].get("family", "blip_itm"), {}).items():
        set_key(data, f"verifier.{key}", value)  # another family's judge: the tiny one of its class
    return data


def row_config(row: Row, benchmark: str, sets: list[str] | tuple[str, ...] = (),
               updates: dict[str, Any] | None = None) -> Config:
    """The row's preset + its overrides (+ the demo mapping on ``demo``) + the caller's ``sets`` and
    typed ``updates`` (applied last), validated."""
    data = load_config(row.preset, list(row.sets)).model_dump(mode="json")
    data["benchmark"] = benchmark
    if benchmark == DEMO:
        to_demo(data)
    for ov in sets:
        apply_override(data, ov)
    for key, value in (updates or {}).items():
        set_key(data, key, value)
    try:
        return Config.model_validate(data)
    except ValidationError as e:
        raise ConfigError(f"row '{row.label}' ({row.preset}): {e.errors()[0]['loc']}: {e.errors()[0]['msg']}") from None


def plan_table(table: TableDef, benchmark: str | None = None, sets: list[str] | tuple[str, ...] = (),
               updates: dict[str, Any] | None = None, runs_dir: str | Path | None = None) -> list[RowPlan]:
    """One plan per row. ``benchmark`` replaces every row's (e.g. ``demo``); ``runs_dir`` (default:
    the config's paths.runs_dir) holds ``<preset>[-<overrides>]-<benchmark>[-set<hash>]`` per run."""
    known = set(list_presets())
    tag = f"-set{hashlib.sha256(chr(10).join(sets).encode()).hexdigest()[:8]}" if sets else ""
    plans = []
    for row in table.rows:
        bench = benchmark or row.benchmark or table.benchmark
        plan = RowPlan(row, bench)
        if row.preset not in known:
            plan.problem = f"preset '{row.preset}' is missing"
        else:
            plan.cfg = row_config(row, bench, sets, updates)
            plan.resolved = plan.cfg.resolved()
            root = Path(runs_dir) if runs_dir else Path(plan.cfg.paths.runs_dir)
            plan.run_dir = root / f"{row.run_key}-{bench}{tag}"
        plans.append(plan)
    by_label = {p.row.label: p for p in plans}
    for plan in plans:
        if plan.row.heads_from is None or plan.cfg is None:
            continue
        src = by_label[plan.row.heads_from]
        if src.cfg is None:
            plan.cfg, plan.resolved, plan.run_dir = None, None, None
            plan.problem = f"its heads' row '{src.row.label}' cannot run ({src.problem})"
        elif src.cfg.rerank.protocol == "training-free":
            plan.cfg, plan.resolved, plan.run_dir = None, None, None
            plan.problem = f"its heads' row '{src.row.label}' fits no heads (rerank.protocol = training-free)"
        else:
            plan.heads_from = src.run_dir
    return plans


def distinct_runs(plans: list[RowPlan]) -> list[RowPlan]:
    """The first plan of every run directory (rows reading other pickers of the same run share it),
    rows that apply another row's heads after every row that fits its own."""
    seen: set[Path] = set()
    out = []
    for p in sorted(plans, key=lambda p: p.heads_from is not None):  # stable: table order otherwise
        if p.cfg is not None and p.run_dir not in seen:
            seen.add(p.run_dir)
            out.append(p)
    return out

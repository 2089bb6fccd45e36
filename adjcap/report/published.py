"""The paper's published numbers, shipped as data (``resources/published.json``), and tables that
put a run's measured numbers beside them."""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

from adjcap.report.tables import Table

PAPER_COLUMNS = ("B-4", "METEOR", "ROUGE-L", "CIDEr", "SPICE")
PAPER_HEADERS = ("B-4", "MET", "R-L", "CIDEr", "SPICE")
# how a peer's published row is marked beside a run's measured rows
PUBLISHED_STATUS = "published, not re-run"


@functools.lru_cache(maxsize=1)
def load_published() -> dict[str, Any]:
    text = (resources.files("adjcap.report") / "resources" / "published.json").read_text(encoding="utf-8")
    return json.loads(text)


def matching_rows(
    config_name: str | None,
    protocol: str | None = None,
    picker: str | None = None,
    benchmark: str | None = None,
) -> list[tuple[str, dict[str, Any]]]:
    """Published rows produced by the preset ``config_name`` on ``benchmark`` (when given) and,
    where the row says, the same protocol/picker: [(table key, row)]."""
    if not config_name:
        return []
    out = []
    for key, tab in load_published()["tables"].items():
        if benchmark is not None and tab.get("benchmark") != benchmark:
            continue
        for row in tab.get("rows", []):
            if row.get("preset") != config_name or "scores" not in row:
                continue
            if protocol and row.get("protocol") and row["protocol"] != protocol:
                continue
            if picker and row.get("picker") and row["picker"] != picker:
                continue
            out.append((key, row))
    return out


def comparison_table(measured: list[tuple[str, str, str, dict[str, Any], str | None]]) -> Table | None:
    """Published rows next to the measured rows of the same configuration.

    ``measured``: [(run label, config name, "protocol / picker", scores, benchmark)]; rows whose
    configuration has a published counterpart on that benchmark get a published row, a measured
    row and a delta.
    """
    tab = Table(
        title="Published (paper) vs measured, x100",
        columns=["source", "configuration", *PAPER_HEADERS],
        caption="'published' rows are the paper's numbers (table label in brackets); 'measured' rows are this "
        "report's runs; delta = measured - published.",
    )
    for run_label, config_name, what, scores, benchmark in measured:
        proto, _, picker = what.partition(" / ")
        rows = matching_rows(config_name, proto or None, picker or None, benchmark)
        seen = set()
        for key, row in rows:
            ident = (row["name"], tuple(row["scores"].get(c) for c in PAPER_COLUMNS))
            if ident in seen:
                continue
            seen.add(ident)
            label = load_published()["tables"][key]["label"]
            tab.rules.add(len(tab.rows))
            tab.rows.append([f"published [{label}]", row["name"], *(row["scores"].get(c) for c in PAPER_COLUMNS)])
            tab.rows.append([f"measured ({run_label})", what, *(scores.get(c) for c in PAPER_COLUMNS)])
            tab.rows.append(
                ["delta", "", *(_delta(scores.get(c), row["scores"].get(c)) for c in PAPER_COLUMNS)]
            )
            break  # one published counterpart per measured row
    return tab if tab.rows else None


def _delta(a: Any, b: Any) -> float | None:
    if a is None or b is None:
        return None
    return round(float(a), 1) - float(b)


def context_table(
    benchmark: str | None, measured: list[tuple[str, dict[str, Any], dict[str, Any] | None]]
) -> Table | None:
    """The paper's table for this benchmark with the measured rows appended (marked measured):
    the scoreboard for COCO, the cross-domain table for Flickr30k / NoCaps.

    ``measured``: [(label, scores, None)] for COCO; [(corpus label, LM-only scores, adjudicated
    scores)] for the cross-domain table (LM-only goes under IFCap, adjudicated under Ours)."""
    pub = load_published()["tables"]
    if benchmark == "coco":
        t = pub["scoreboard"]
        tab = Table(title=f"{t['title']} [{t['label']}] + measured", columns=["method", "status", *PAPER_HEADERS])
        for row in t["rows"]:
            tab.rows.append([row["name"], PUBLISHED_STATUS, *(row["scores"].get(c) for c in PAPER_COLUMNS)])
        if measured:
            tab.rules.add(len(tab.rows))
        for name, scores, _ in measured:
            tab.rows.append([name, "measured", *(scores.get(c) for c in PAPER_COLUMNS)])
        return tab
    if benchmark in ("flickr30k", "nocaps"):
        t = pub["xdomain"]
        tab = Table(
            title=f"{t['title']} [{t['label']}] + measured",
            columns=["corpus", "status", "IFCap CIDEr", "IFCap SPICE", "Ours CIDEr", "Ours SPICE"],
        )
        for row in t["rows"]:
            if row["benchmark"] == benchmark:
                tab.rows.append([row["corpus"], PUBLISHED_STATUS, row["ifcap"]["CIDEr"], row["ifcap"]["SPICE"],
                                 row["ours"]["CIDEr"], row["ours"]["SPICE"]])
        if measured:
            tab.rules.add(len(tab.rows))
        for name, lm, adj in measured:
            adj = adj or {}
            tab.rows.append([name, "measured", lm.get("CIDEr"), lm.get("SPICE"), adj.get("CIDEr"), adj.get("SPICE")])
        return tab
    return None


def published_table(key: str) -> Table:
    """One of the paper's tables as published (rows with per-metric scores)."""
    t = load_published()["tables"][key]
    tab = Table(title=f"{t['title']} (published)", columns=["configuration", *PAPER_HEADERS], label=t["label"] + "-published")
    for row in t["rows"]:
        if "scores" in row:
            tab.rows.append([row["name"], *(row["scores"].get(c) for c in PAPER_COLUMNS)])
    return tab

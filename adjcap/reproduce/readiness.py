"""Whether a table's runs can start on this machine: the union of its runs' missing needs
(:mod:`adjcap.machine.needs`) and the one ``adjcap prepare`` command that fetches them."""

from __future__ import annotations

from collections.abc import Iterable

from adjcap.machine.needs import missing, needs_of
from adjcap.reproduce.plan import distinct_runs, plan_table
from adjcap.reproduce.tables import TableDef, listing


def table_missing(table: TableDef, sets: Iterable[str] = ()) -> list[str]:
    """What the table's runs need and this machine lacks (each thing once, in first-use order)."""
    out: dict[str, None] = {}
    for p in distinct_runs(plan_table(table, None, list(sets))):
        for n in missing(needs_of(p.resolved)):
            out[n.what] = None
    return list(out)


def table_status(table: TableDef, sets: Iterable[str] = ()) -> str:
    """``ready`` or ``missing N: ...; adjcap prepare --for KEY``."""
    gone = table_missing(table, sets)
    if not gone:
        return "ready"
    shown = ", ".join(gone[:4]) + (f", ... (+{len(gone) - 4})" if len(gone) > 4 else "")
    return f"missing {len(gone)}: {shown} -> adjcap prepare --for {table.key}"


def listing_with_status() -> str:
    """``adjcap reproduce --list``: the tables, their rows, and per table ready / missing."""
    return listing(status=table_status)

"""The paper's tables as data and their reproduction: the table registry (:mod:`.tables`, from
``tables.toml``) and the runs a table needs (:mod:`.plan`); the rendered comparison is a report
(:mod:`adjcap.report.reproduced`), a layer above.
The Ray job is ``jobs/reproduce.py`` (``adjcap reproduce TABLE``)."""

from adjcap.reproduce.readiness import listing_with_status, table_missing, table_status
from adjcap.reproduce.plan import RowPlan, distinct_runs, plan_table, row_config, to_demo
from adjcap.reproduce.tables import Column, Difference, Row, TableDef, get_table, listing, load_tables, parse_tables

__all__ = [
    "Column", "Difference", "Row", "RowPlan", "TableDef", "distinct_runs", "get_table",
    "listing", "listing_with_status", "load_tables", "parse_tables", "plan_table",
    "row_config", "table_missing", "table_status", "to_demo",
]

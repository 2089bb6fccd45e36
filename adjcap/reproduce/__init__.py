"""The paper's tables as data and their reproduction: the table registry (:mod:`.tables`, from
``tables.toml``), the runs a table needs (:mod:`.plan`) and the rendered comparison (:mod:`.render`).
The Ray job is ``jobs/reproduce.py`` (``adjcap reproduce TABLE``)."""

from adjcap.reproduce.readiness import listing_with_status, table_missing, table_status
from adjcap.reproduce.plan import RowPlan, distinct_runs, plan_table, row_config, to_demo
from adjcap.reproduce.render import RowResult, build_table, lookup, published_row, published_value
from adjcap.reproduce.tables import Column, Difference, Row, TableDef, get_table, listing, load_tables, parse_tables

__all__ = [
    "Column", "Difference", "Row", "RowPlan", "RowResult", "TableDef", "build_table", "distinct_runs", "get_table",
    "listing", "listing_with_status", "load_tables", "lookup", "parse_tables", "plan_table", "published_row", "published_value",
    "row_config", "table_missing", "table_status", "to_demo",
]

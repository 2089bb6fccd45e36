"""One look for every HTML page adjcap writes (run report, compare, reproduce, diagnostics): the
report's stylesheet around a body."""

from __future__ import annotations

import html

from adjcap.report.gallery import GALLERY_CSS
from adjcap.report.tables import Table


def html_page(title: str, body: str, script: str = "") -> str:
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'>"
            f"<title>{html.escape(title)}</title><style>{GALLERY_CSS}</style></head><body>"
            + body + (f"<script>{script}</script>" if script else "") + "</body></html>")


def table_page(table: Table, title: str, intro: str = "", extra: list[Table] | tuple[Table, ...] = ()) -> str:
    """A page holding one table (and the ``extra`` tables after it) under an ``<h1>`` title."""
    return html_page(title, f"<h1>{html.escape(title)}</h1>" + (f"<p>{html.escape(intro)}</p>" if intro else "")
                     + table.to_html() + "".join(t.to_html() for t in extra))

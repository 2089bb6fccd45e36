"""Reports: paper-style tables (Markdown + LaTeX), comparison with the paper's published numbers,
PNG plots and the qualitative HTML gallery. Entry point: :func:`write_report`."""

from __future__ import annotations

from typing import Any

__all__ = ["write_report", "load_run", "load_published"]


def __getattr__(name: str) -> Any:
    if name == "write_report":
        from adjcap.report.report import write_report

        return write_report
    if name == "load_run":
        from adjcap.report.collect import load_run

        return load_run
    if name == "load_published":
        from adjcap.report.published import load_published

        return load_published
    raise AttributeError(f"module 'adjcap.report' has no attribute '{name}'")

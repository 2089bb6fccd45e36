"""adjcap: Adjudicated Captioning. The Python API (``adjcap.api``, the package's Python entry
point), loaded on first use (PEP 562) so that ``import adjcap`` stays cheap (no torch, no Ray)::

    import adjcap
    result = adjcap.caption("my-photos/", preset="demo")
    adjcap.run("demo"), adjcap.evaluate(predictions, references), adjcap.load_run("runs/demo")
"""

from __future__ import annotations

from typing import Any

__all__ = ["Candidate", "Caption", "Captions", "Metrics", "Run", "caption", "evaluate", "load_run", "run"]


def __getattr__(name: str) -> Any:
    if name == "__version__":  # the installed distribution's (pyproject.toml owns it)
        from importlib import metadata

        return metadata.version("adjcap")
    if name in __all__:
        from adjcap import api  # the Python API: it alone runs jobs, inside caption() and run()

        return getattr(api, name)
    raise AttributeError(f"module 'adjcap' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])

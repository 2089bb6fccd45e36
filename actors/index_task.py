"""The CPU task that reads the caption index for a job's retrievers: the finished index and its corpus's
texts as one shared object (:func:`adjcap.index.shared.shared_index`), read and put into the object
store by a worker, so the driver's CPU stays off the index's vectors (docs/benchmarks/pipeline.md, "The driver
off the image path"). Lost with its node, Ray runs it again. Its worker exits after it (``max_calls=1``):
``adjcap.index`` imports PyTorch, which the decode tasks that could reuse the worker do without."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from adjcap.index.shared import SharedIndex, shared_index


def put_index(out: str, texts: Sequence[str]) -> SharedIndex:
    """``out``: the finished index (checked against its manifest); ``texts``: its corpus's captions."""
    return shared_index(Path(out), texts)

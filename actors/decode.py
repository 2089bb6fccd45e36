"""The decode task ahead of the GPU pools (a Ray Data task): :func:`adjcap.engine.decode_task.decode_table`
(the library half, the local backend's too), metered for the job's progress."""

from __future__ import annotations

import functools
import time
from typing import Any, Sequence

import pyarrow as pa

from adjcap.actors.progress import StageMeter
from adjcap.engine.decode_task import decode_table
from adjcap.engine.pixel_prep import PixelPrep


@functools.cache
def _meter(board: Any) -> StageMeter:
    return StageMeter("decode", board)


def decode_batch(batch: pa.Table, board: Any = None, preps: Sequence[PixelPrep] = (),
                 keep_bytes: bool = True) -> pa.Table:
    """``board``: the job's :class:`actors.progress.ProgressBoard` (None: metrics only); ``preps`` and
    ``keep_bytes``: :func:`adjcap.engine.decode_task.decode_table`'s."""
    t = time.perf_counter()
    out, n, failed = decode_table(batch, preps, keep_bytes)
    _meter(board).record(n, failed, time.perf_counter() - t)
    return out

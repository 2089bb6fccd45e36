"""CPU task ahead of the GPU pools: records -> decoded images inside fresh states (holding the stage
outputs the stage cache already had for the image, when the record carries them)."""

from __future__ import annotations

import functools
import pickle
import time
from typing import Any

from adjcap.actors.progress import StageMeter
from adjcap.actors.transport import pack
from adjcap.stage_cache import apply_outputs
from adjcap.image_state import decode_state


@functools.cache
def _meter(board: Any) -> StageMeter:
    return StageMeter("decode", board)


def decode_batch(batch: dict[str, Any], board: Any = None) -> dict[str, Any]:
    """``board``: the job's :class:`actors.progress.ProgressBoard` (None: metrics only)."""
    t = time.perf_counter()
    states = []
    for i in range(len(batch["image_id"])):
        s = decode_state(str(batch["image_id"][i]), str(batch["benchmark"][i]), str(batch["split"][i]),
                         str(batch["domain"][i] or "") or None, str(batch["image_path"][i] or "") or None,
                         str(batch["error"][i] or "") or None if "error" in batch else None,
                         bool(batch["exif"][i]) if "exif" in batch else True)
        cached = batch["cached"][i] if "cached" in batch else None
        if s.ok and cached:  # the stage outputs the stage cache already holds for this image
            apply_outputs(s, pickle.loads(cached))
        states.append(s)
    refused = sum(1 for e in batch.get("error", ()) if e)  # refused by the reader: not this stage's failure
    failed = sum(1 for s in states if s.error is not None) - refused
    _meter(board).record(len(states), failed, time.perf_counter() - t)
    return pack(states)

"""Packing per-image states into Ray Data batches (numpy format) and back, and small per-image columns."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

from adjcap.image_state import ImageState


def unpack(batch: dict[str, Any]) -> list[ImageState]:
    return [pickle.loads(b) for b in batch["state"]]


def pack(states: list[ImageState], drop_image: bool = False) -> dict[str, np.ndarray]:
    if drop_image:
        for s in states:
            s.drop_image()
            s.verifier_memo = None  # the stage-1 embedding stays: the stage cache keeps it with the retrieval
    out_state = np.empty(len(states), dtype=object)
    out_state[:] = [pickle.dumps(s, protocol=pickle.HIGHEST_PROTOCOL) for s in states]
    ids = np.array([s.image_id for s in states], dtype=object)
    return {"image_id": ids, "state": out_state}


def columns(cols: dict[str, list]) -> dict[str, np.ndarray]:
    """Plain per-image columns (strings) as a numpy-format batch."""
    out = {}
    for k, v in cols.items():
        a = np.empty(len(v), dtype=object)
        a[:] = v
        out[k] = a
    return out

"""CPU task ahead of the GPU pools: a table of records (the driver's: :func:`actors.transport.records`)
-> decoded images inside fresh states (holding the stage outputs the stage cache already had for the
image, when the record carries them), resized and cropped for the pools' models (:mod:`adjcap.pixel_prep`),
packed as the transport's columns."""

from __future__ import annotations

import functools
import time
from typing import Any, Sequence

import pyarrow as pa

from adjcap.actors.progress import StageMeter
from adjcap.actors.transport import pack, unpack
from adjcap.image_state import decode_state
from adjcap.pixel_prep import PixelPrep


@functools.cache
def _meter(board: Any) -> StageMeter:
    return StageMeter("decode", board)


def decode_batch(batch: pa.Table, board: Any = None, preps: Sequence[PixelPrep] = (),
                 keep_bytes: bool = True) -> pa.Table:
    """``board``: the job's :class:`actors.progress.ProgressBoard` (None: metrics only); ``preps``: the
    geometries the pools' models want, prepared here once per image (:mod:`adjcap.pixel_prep`);
    ``keep_bytes``: the image's bytes travel too (a pool decodes them itself: a model whose
    preprocessing is not known before it loads)."""
    t = time.perf_counter()
    given = unpack(batch)  # ids, split, domain, the reader's error, stored stage outputs
    paths = batch.column("image_path").to_pylist()
    exif = batch.column("exif").to_pylist() if "exif" in batch.column_names else [True] * len(given)
    states = []
    for g, path, ex in zip(given, paths, exif):
        s = decode_state(g.image_id, g.benchmark, g.split, g.domain, path or None, g.error, bool(ex), keep_bytes)
        if s.ok:
            s.prepare_pixels(preps)
            # the stage outputs the stage cache already holds for this image travel with it
            g.image, g.encoded, g.pixels = s.image, s.encoded, s.pixels
            s = g
        states.append(s)
    refused = sum(1 for g in given if g.error)  # refused by the reader: not this stage's failure
    failed = sum(1 for s in states if s.error is not None) - refused
    _meter(board).record(len(states), failed, time.perf_counter() - t)
    return pack(states)

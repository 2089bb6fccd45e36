"""The decode step's batch function, ahead of the pools (the library half of the Ray decode task,
``actors/decode.py``; the local backend calls it in process): a table of records (the engine's:
:func:`adjcap.engine.executor.records_table`) -> decoded images inside fresh states (holding the stage
outputs the stage cache already had for the image, when the record carries them), resized and cropped
for the pools' models (:mod:`adjcap.engine.pixel_prep`), packed as the transport's columns. Imports no model
library."""

from __future__ import annotations

from typing import Sequence

import pyarrow as pa

from adjcap.engine.transport import pack, unpack
from adjcap.engine.image_state import decode_state
from adjcap.engine.pixel_prep import PixelPrep


def decode_table(batch: pa.Table, preps: Sequence[PixelPrep] = (), keep_bytes: bool = True) -> tuple[pa.Table, int, int]:
    """(the packed states, images, images that failed here: not counting those the reader refused).
    ``preps``: the geometries the pools' models want, prepared here once per image; ``keep_bytes``: the
    image's bytes travel too (a pool decodes them itself: a model whose preprocessing is not known
    before it loads)."""
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
    return pack(states), len(states), failed

"""Parquet parts: a folder of ``part-*.parquet`` files, each written atomically (complete or absent)
under a name no other writer takes (time-ordered: read in the order they were written) or a name
derived from its content (:func:`content_part_name`: a batch written again replaces its part; these
sort after the time-ordered ones, by hash); a part that cannot be read
is set aside as ``<name>.corrupt`` (kept for inspection, never read again) so that its images are
recomputed. The one part writer of a run's feature parts (:class:`adjcap.storage.rundir.RunDir`) and of the
stage cache (:mod:`adjcap.engine.stage_cache`)."""

from __future__ import annotations

import hashlib
import os
import socket
import sys
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from adjcap.storage.io import atomic_write_parquet, is_temp_name

PART_GLOB = "part-*.parquet"


def part_paths(folder: Path) -> list[Path]:
    """The complete parts in ``folder``, sorted by name (see the module docstring; none when it is absent)."""
    return sorted(p for p in folder.glob(PART_GLOB) if not is_temp_name(p.name)) if folder.is_dir() else []


def new_part_name() -> str:
    """A part name no other writer can take: time-ordered, then host, pid and a random suffix."""
    host = "".join(c if c.isalnum() else "_" for c in socket.gethostname())[:24]
    return f"part-{time.time_ns():020d}-{host}-{os.getpid()}-{uuid.uuid4().hex[:8]}.parquet"


def content_part_name(key: str, image_ids) -> str:
    """A part name decided by what the part holds: ``key`` (whose rows: the run or stage identity, the
    split) and the sorted image ids. A batch computed again (a retried task, a restarted actor) writes
    the same name, so it replaces its own part instead of adding a second copy of its images."""
    h = hashlib.sha256(key.encode())
    for i in sorted(str(i) for i in image_ids):
        h.update(b"\0" + i.encode())
    return f"part-c{h.hexdigest()[:32]}.parquet"


def write_part(folder: Path, table: pa.Table, name: str | None = None) -> Path:
    """``table`` as a part of ``folder``, written atomically: under ``name`` (from
    :func:`content_part_name`, replacing a part of that name) or a new name no other writer takes."""
    return atomic_write_parquet(folder / (name or new_part_name()), table)


def read_part(part: Path, columns: list[str] | None = None) -> pa.Table | None:
    """The part's rows, or None when it cannot be read: it is then renamed to ``<name>.corrupt`` and a
    warning on stderr says its images will be recomputed."""
    try:
        return pq.read_table(part, columns=columns)
    except Exception as e:  # noqa: BLE001 - any unreadable part is set aside the same way
        dest = part.with_name(part.name + ".corrupt")
        os.replace(part, dest)
        print(f"warning: {part} is unreadable ({type(e).__name__}); moved to {dest.name}, "
              "its images will be recomputed", file=sys.stderr)
        return None

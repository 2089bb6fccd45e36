"""Atomic file writes: a file is either absent or complete, never half-written."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq


def _tmp_beside(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    return Path(name)


def fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable (best effort where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _commit(tmp: Path, path: Path) -> None:
    """fsync the finished temp file, rename it into place, fsync the directory."""
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def _naming(e: OSError, path: Path) -> OSError:
    """The error with the file it was writing named (a full disk says where); the temp file is removed."""
    if e.filename:
        return e
    errno_ = e.errno
    if errno_ is None and "No space left on device" in str(e):  # Arrow's IOError carries no errno
        errno_ = errno.ENOSPC
    return OSError(errno_, e.strerror or str(e), str(path))


def _atomically(path: str | Path, write: Callable[[Path], None]) -> Path:
    """``write(tmp)`` to a temp name beside ``path``, then renamed onto it (complete or absent)."""
    path = Path(path)
    tmp = _tmp_beside(path)
    try:
        write(tmp)
        _commit(tmp, path)
    except OSError as e:
        raise _naming(e, path) from e
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    return _atomically(path, lambda tmp: tmp.write_bytes(data))


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any, indent: int | None = 2) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=indent, ensure_ascii=False) + "\n")


def atomic_write_parquet(path: str | Path, table: pa.Table) -> Path:
    return _atomically(path, lambda tmp: pq.write_table(table, tmp))


def is_temp_name(name: str) -> bool:
    """Temp files written by this module (ignored by readers and resume)."""
    return name.startswith(".") and name.endswith(".tmp")


_CHECKSUMS: dict[tuple[str, int, int, int, str], str] = {}


def file_checksum(path: str | Path, algo: str = "sha256") -> str:
    """The hex digest (``algo``: sha256, sha1, ...) of the whole file, to compare with a published or
    recorded checksum; cached within the process per path, size, mtime and inode."""
    st = os.stat(path)
    key = (str(path), st.st_size, st.st_mtime_ns, st.st_ino, algo)
    if key not in _CHECKSUMS:
        h = hashlib.new(algo)
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        _CHECKSUMS[key] = h.hexdigest()
    return _CHECKSUMS[key]

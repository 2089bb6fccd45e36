"""Content ids of files, for identities and provenance: what a file holds, not where it lies.

:func:`file_content_id` is ``<size>-<first 16 hex digits of the sha256 of the whole file>``, read in
blocks (a 3 GB corpus never sits in memory). Files up to 64 MiB had exactly this id before; larger
ones used to be sampled (their first, middle and last MiB), so an edit elsewhere kept the old id and
its stale outputs: their id changed once, to the whole-file one (docs/guide/run-directory.md).

The one exception: a weights file (:data:`WEIGHT_SUFFIXES`) over 64 MiB whose sha256 and size
``adjcap prepare`` recorded in the prepare lock of a folder above it keeps its sampled id, so the
stage caches and indexes keyed by a prepared checkpoint keep resuming; prepare checked its bytes and
``adjcap prepare --verify`` checks them again.

A whole-file id is remembered twice: in the process, and for files of at least :data:`STORE_MIN_BYTES`
in a small persistent store, ``{$ADJCAP_CACHE}/content-ids/`` (one small JSON file per path, written
atomically: several processes may write the same entry, each write whole), by the file's path, size,
mtime, ctime and inode, so a rerun does not read a large corpus again. A file modified within
:data:`RACY_S` seconds of being hashed is not remembered (a second write in the same clock tick would
keep its size and mtime)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from pathlib import Path

from adjcap.storage.io import atomic_write_text

MIB = 1 << 20
SAMPLED_ABOVE = 64 * MIB  # the old ids sampled files larger than this (first, middle, last MiB)
WEIGHT_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin", ".ckpt")
PREPARE_LOCK = "prepare.lock.json"  # adjcap.prepare.lock's file, in the data folder (its name is this)
STORE_MIN_BYTES = MIB  # smaller files are hashed again rather than stored
RACY_S = 2.0

Key = tuple[str, int, int, int, int]  # path, size, mtime_ns, ctime_ns, inode
_MEMO: dict[Key, str] = {}


def file_content_id(p: str | Path) -> str:
    """``p``'s content id (module docstring): the whole file's, or a prepared weights file's sampled one."""
    path = os.path.abspath(p)
    st = os.stat(path)
    key: Key = (path, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
    if key in _MEMO:
        return _MEMO[key]
    if st.st_size > SAMPLED_ABOVE and path.endswith(WEIGHT_SUFFIXES) and prepared_size(Path(path)) == st.st_size:
        found = sampled_id(path, st.st_size)
    else:
        found = _stored(key)
        if found is None:
            found = f"{st.st_size}-{whole_file_sha256(path)[:16]}"
            if time.time() - st.st_mtime_ns / 1e9 < RACY_S:
                return found  # it may change again within the same clock tick: remembered nowhere
            _store(key, found)
    _MEMO[key] = found
    return found


def whole_file_sha256(path: str | Path) -> str:
    """The hex sha256 of the whole file, read in 8 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(8 * MIB), b""):
            h.update(block)
    return h.hexdigest()


def sampled_id(path: str | Path, size: int) -> str:
    """The id the first, middle and last MiB give (what every file over 64 MiB had before)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for offset in (0, size // 2, size - MIB):
            f.seek(offset)
            h.update(f.read(MIB))
    return f"{size}-{h.hexdigest()[:16]}"


def prepared_size(path: Path) -> int | None:
    """The size ``adjcap prepare`` recorded with ``path``'s sha256 in the prepare lock of the nearest
    folder above it that has one, or None (no lock, or the lock does not hold the file)."""
    for folder in path.parents:
        lock = folder / PREPARE_LOCK
        try:
            st = lock.stat()
        except OSError:
            continue
        rec = _lock_files(str(lock), st.st_mtime_ns, st.st_size).get(path.relative_to(folder).as_posix())
        return rec.get("size") if isinstance(rec, dict) and rec.get("sha256") else None
    return None


@functools.lru_cache(maxsize=8)
def _lock_files(lock: str, mtime_ns: int, size: int) -> dict:
    try:
        files = json.loads(Path(lock).read_text(encoding="utf-8")).get("files")
    except (OSError, ValueError, AttributeError):
        return {}
    return files if isinstance(files, dict) else {}


# ---- the persistent store -------------------------------------------------------------------


def store_dir() -> Path:
    """Where whole-file ids are remembered: ``$ADJCAP_CACHE/content-ids`` (default ~/.cache/adjcap)."""
    return Path(os.path.expanduser(os.environ.get("ADJCAP_CACHE") or "~/.cache/adjcap")) / "content-ids"


def _entry(path: str) -> Path:
    return store_dir() / f"{hashlib.sha256(path.encode()).hexdigest()[:32]}.json"


def _stored(key: Key) -> str | None:
    """The id remembered for exactly this path, size, mtime, ctime and inode, or None."""
    if key[1] < STORE_MIN_BYTES:
        return None
    try:
        doc = json.loads(_entry(key[0]).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ok = isinstance(doc, dict) and doc.get("key") == list(key) and isinstance(doc.get("id"), str)
    return doc["id"] if ok else None


def _store(key: Key, content_id: str) -> None:
    """Remember ``content_id`` for ``key`` (one entry per path: a changed file replaces its entry). A
    store that cannot be written (a read-only cache) only costs a hash next time."""
    if key[1] < STORE_MIN_BYTES:
        return
    try:
        atomic_write_text(_entry(key[0]), json.dumps({"key": list(key), "id": content_id}) + "\n")
    except OSError:
        pass

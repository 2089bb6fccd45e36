"""The one file lock: one writer at a time per folder, an ``flock`` on a small file that names its
holder (pid, host, since when). The OS releases it when the holder dies, so a killed writer never
blocks the next one, and what it left behind belongs to whoever takes the lock next. Used for a run
directory (:meth:`adjcap.storage.rundir.RunDir.lock`), `adjcap prepare`'s data folders
(:mod:`adjcap.prepare.runlock`) and the LAVIS environment's build."""

from __future__ import annotations

import fcntl
import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator


class LockBusy(RuntimeError):
    """Another process holds the lock; the message names it."""


def _busy(lock_file: Path, holder: str) -> Exception:
    return LockBusy(f"{lock_file} is held by {holder}; wait for it to finish")


@contextmanager
def holding(lock_file: str | Path, wait: bool = False,
            busy: Callable[[Path, str], Exception] = _busy) -> Iterator[None]:
    """Hold ``lock_file`` for the body (created with its folder). Held by another process: wait for
    it (``wait``), else raise ``busy(lock_file, holder)`` at once (``holder``: "pid N on host H since
    T", as the holder wrote it)."""
    lock_file = Path(lock_file)
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip() or "another process"
            raise busy(lock_file, holder) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on host {socket.gethostname()} since "
                      f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(), 0)
        yield
    finally:
        os.close(fd)

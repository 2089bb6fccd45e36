"""One writer at a time per work folder: an ``flock`` on a small file that names its holder (pid, host,
since when). The OS releases it when the holder dies, so a killed run never blocks the next one, and
what a killed run left behind belongs to whoever takes the lock next (see ``leftovers``)."""

from __future__ import annotations

import fcntl
import os
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from adjcap.prepare.errors import PrepareError

RUN_LOCK_NAME = ".prepare-run.lock"  # in {data}: held by the `adjcap prepare` that writes there


@contextmanager
def holding(lock_file: Path, what: str, wait: bool = False) -> Iterator[None]:
    """Hold ``lock_file`` for the body; a second holder fails at once with one line naming the first
    (``what``: the thing being prepared, for the message), or with ``wait`` waits for it to finish."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip() or "another process"
            raise PrepareError(f"{what} is being prepared by {holder} (lock {lock_file}); wait for it to "
                               "finish and run again") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on host {socket.gethostname()} since "
                      f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(), 0)
        yield
    finally:
        os.close(fd)

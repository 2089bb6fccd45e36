"""One `adjcap prepare` writer at a time per work folder: :func:`adjcap.storage.file_lock.holding` on
``RUN_LOCK_NAME``, with prepare's message. What a killed run left behind belongs to whoever takes the
lock next (see ``leftovers``)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from adjcap.storage.file_lock import holding as hold_file
from adjcap.prepare.errors import PrepareError

RUN_LOCK_NAME = ".prepare-run.lock"  # in {data}: held by the `adjcap prepare` that writes there


@contextmanager
def holding(lock_file: Path, what: str, wait: bool = False) -> Iterator[None]:
    """Hold ``lock_file`` for the body; a second holder fails at once with one line naming the first
    (``what``: the thing being prepared, for the message), or with ``wait`` waits for it to finish."""
    def busy(path: Path, holder: str) -> Exception:
        return PrepareError(f"{what} is being prepared by {holder} (lock {path}); wait for it to finish and run again")

    with hold_file(lock_file, wait=wait, busy=busy):
        yield

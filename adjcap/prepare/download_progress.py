"""One progress line for many parallel downloads: files, bytes, rate and ETA."""

from __future__ import annotations

import sys
import threading
import time
from typing import Callable, TextIO


def human_bytes(n: float | None) -> str:
    if n is None:
        return "size unknown"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000.0
    return f"{n:.1f} TB"  # pragma: no cover


def human_seconds(s: float) -> str:
    s = int(max(s, 0))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


class Progress:
    """Thread-safe counters shown as ``label: 12/100 files  3.4 MB/20.0 MB  1.2 MB/s  ETA 14s``.

    On a terminal the line is redrawn in place (at most 5 times a second); otherwise a line is written
    every ``every`` seconds and once at the end, so logs stay short."""

    def __init__(self, label: str, files: int, total_bytes: int | None, stream: TextIO | None = None,
                 every: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.label = label
        self.files_total = files
        self.bytes_total = total_bytes
        self.files_done = 0
        self.bytes_done = 0
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.every = 0.2 if self.tty else every
        self._clock = clock
        self._start = clock()
        self._last = self._start
        self._lock = threading.Lock()

    def add_bytes(self, n: int) -> None:
        with self._lock:
            self.bytes_done += n
            self._maybe_draw()

    def add_total(self, n: int) -> None:
        """A file's size became known (or was a guess): adjust the byte total."""
        with self._lock:
            self.bytes_total = (self.bytes_total or 0) + n

    def file_done(self) -> None:
        with self._lock:
            self.files_done += 1
            self._maybe_draw()

    def line(self) -> str:
        elapsed = max(self._clock() - self._start, 1e-6)
        rate = self.bytes_done / elapsed
        total = self.bytes_total
        eta = ""
        if total and rate > 0 and total > self.bytes_done:
            eta = f"  ETA {human_seconds((total - self.bytes_done) / rate)}"
        of = f"/{human_bytes(total)}" if total else ""
        return (f"{self.label}: {self.files_done}/{self.files_total} files  "
                f"{human_bytes(self.bytes_done)}{of}  {human_bytes(rate)}/s{eta}")

    def _maybe_draw(self) -> None:
        now = self._clock()
        if now - self._last >= self.every:
            self._last = now
            self._write(self.line())

    def _write(self, text: str) -> None:
        if self.tty:
            self.stream.write("\r\x1b[2K" + text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        with self._lock:
            self._write(self.line())
            if self.tty:
                self.stream.write("\n")
                self.stream.flush()

"""Resumable, verified, parallel downloads (standard library only).

Each file is written to ``<dest>.partial`` and renamed to ``dest`` only after its size and sha256 were
checked, so ``dest`` is either complete or absent. A ``.partial`` left by a dropped connection or an
interrupted run is continued with an HTTP ``Range`` request that carries ``If-Range`` (the first
response's strong ETag, else its Last-Modified, kept beside the partial in ``<dest>.partial.meta``): a
file that changed on the server in between is sent whole and downloaded afresh, never spliced; without
a validator, or when the server ignores Range, the download starts over. Transient faults (connection
drops, timeouts, HTTP 408/429/5xx) are retried with exponential backoff within the deadlines
(``Deadlines``: no byte for ``stall_seconds``, or below ``min_bytes_per_second`` over a window, ends it
with one line; what arrived is kept for the next run); other HTTP errors fail at once. Connections per
host are capped. ``--from DIR`` copies go through the same checks."""

from __future__ import annotations

import errno
import http.client
import json
import os
import random
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Sequence, TextIO

from adjcap.prepare.errors import ChecksumError, DiskFullError, NetworkError, PrepareError
from adjcap.prepare.limits import Deadlines
from adjcap.prepare.download_progress import Progress
from adjcap.prepare.sources import host_of
from adjcap.storage.io import file_checksum

USER_AGENT = "adjcap-prepare/0.1 (+python urllib)"
RETRY_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
CHUNK = 1 << 20


@dataclass
class Item:
    """One file to fetch: from ``url`` (or the local copy ``local``) to ``dest``."""

    url: str
    dest: Path
    size: int | None = None  # published size in bytes
    sha256: str | None = None  # published sha256, or the one recorded in the lock
    approx: int | None = None  # a guess, for progress only
    local: Path | None = None  # --from: copy this file instead of downloading
    pinned_by: str = "sources.toml"  # where ``sha256`` comes from (a lock names its path and entry)


@dataclass
class Fetched:
    item: Item
    sha256: str
    size: int
    skipped: bool  # already there and verified; nothing transferred


class _Dropped(Exception):
    """The server closed the connection before the announced length arrived."""


class _Changed(Exception):
    """The server's file is not the one the ``.partial`` holds the start of: start over."""


class _WriteFailed(Exception):
    def __init__(self, err: OSError):
        super().__init__(str(err))
        self.err = err


PARTIAL = ".partial"  # <dest>.partial: the bytes so far; <dest>.partial.meta: how to resume them
META = ".meta"


def _partial(dest: Path) -> Path:
    return dest.with_name(dest.name + PARTIAL)


def _meta(part: Path) -> Path:
    return part.with_name(part.name + META)


def _validator(headers) -> str | None:
    """What ``If-Range`` may carry for this response: a strong ETag, else Last-Modified, else None."""
    etag = headers.get("ETag")
    if etag and not etag.startswith("W/"):
        return etag
    return headers.get("Last-Modified") or None


def _same_file(validator: str, headers) -> bool:
    """Whether a 206 answer describes the file ``validator`` was taken from (a server that ignores
    If-Range but honours Range would otherwise splice two versions)."""
    etag, modified = headers.get("ETag"), headers.get("Last-Modified")
    if validator.startswith('"'):
        return etag is None or etag == validator
    return modified is None or modified == validator


def _read_meta(part: Path, url: str) -> str | None:
    """The validator recorded when ``part`` was started from ``url``; None when unknown."""
    try:
        meta = json.loads(_meta(part).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("url") != url or not isinstance(meta.get("if_range"), str):
        return None
    return meta["if_range"]


def _write_meta(part: Path, url: str, validator: str | None) -> None:
    m = _meta(part)
    if validator is None:
        m.unlink(missing_ok=True)
        return
    tmp = m.with_name(m.name + ".tmp")
    tmp.write_text(json.dumps({"url": url, "if_range": validator}))
    os.replace(tmp, m)


def resumable(part: Path) -> bool:
    """Whether a ``.partial`` left by an earlier run can be resumed: it holds bytes and its ``.meta``
    names the URL and the validator to resume them with (else the next download starts over anyway)."""
    try:
        meta = json.loads(_meta(part).read_text())
        size = part.stat().st_size
    except (OSError, ValueError):
        return False
    return (size > 0 and isinstance(meta, dict) and isinstance(meta.get("url"), str)
            and isinstance(meta.get("if_range"), str))


def discard_partial(part: Path) -> None:
    part.unlink(missing_ok=True)
    _meta(part).unlink(missing_ok=True)


class _Clock:
    """The deadlines of one file's download, across its retries: the time of the last byte, and the
    bytes received over the last rate window."""

    def __init__(self, d: Deadlines):
        self.d = d
        self.t0 = time.monotonic()
        self.last_byte = self.t0
        self.total = 0
        self.samples: deque[tuple[float, int]] = deque([(self.t0, 0)])

    def got(self, n: int) -> None:
        now = time.monotonic()
        self.total += n
        self.last_byte = now
        self.samples.append((now, self.total))
        horizon = now - self.d.rate_window_seconds
        while len(self.samples) > 1 and self.samples[1][0] <= horizon:
            self.samples.popleft()

    def pause(self, seconds: float) -> None:
        """Time spent waiting for a connection slot (other downloads to the host) is not a stall."""
        self.t0 += seconds
        self.last_byte += seconds
        self.samples = deque((t + seconds, cum) for t, cum in self.samples)

    def left(self) -> float:
        """Seconds until the stall deadline."""
        return self.d.stall_seconds - (time.monotonic() - self.last_byte)

    def rate_shortfall(self) -> float | None:
        """The average rate over the last window when some bytes but fewer than the minimum arrived in
        it (and the download has run a whole window); else None."""
        if self.d.min_bytes_per_second <= 0:
            return None
        now = time.monotonic()
        window = self.d.rate_window_seconds
        if now - self.t0 < window:
            return None
        horizon = now - window
        base = self.samples[0][1]
        for t, cum in self.samples:  # bytes received at or before the window's start
            if t <= horizon:
                base = cum
        if self.total == base:
            return None  # nothing at all arrived: a stall (the stall deadline's case), not a drip
        rate = (self.total - base) / window
        return rate if rate < self.d.min_bytes_per_second else None


def check_bytes(path: Path, item: Item, what: str) -> str:
    """sha256 of ``path`` after checking it against the item's size and sha256 (ChecksumError)."""
    size = path.stat().st_size
    if item.size is not None and size != item.size:
        raise ChecksumError(
            f"{what}: {size} bytes, expected {item.size}; the file was removed - run again, or check "
            "that the source has not changed (sources.toml)"
        )
    digest = file_checksum(path)
    if item.sha256 and digest != item.sha256.lower():
        if item.pinned_by == "sources.toml":
            fix = "run again, or if the source really changed, update its sha256 in the sources file"
        else:
            fix = (f"run again; if the source really changed, or the lock was written by an older adjcap "
                   f"from a download that then failed its checks, delete the {item.pinned_by} and run again")
        raise ChecksumError(
            f"{what}: sha256 {digest[:16]}... does not match the expected {item.sha256[:16]}... "
            f"(from {item.pinned_by}); the file was removed and nothing was laid out - {fix}"
        )
    return digest


class Downloader:
    def __init__(
        self,
        workers: int = 8,
        host_limits: dict[str, int] | None = None,
        retries: int = 5,
        backoff: float = 0.5,
        timeout: float = 60.0,
        open_file: Callable[[Path, str], IO[bytes]] = open,  # type: ignore[assignment]
        stream: TextIO | None = None,
        deadlines: Deadlines | None = None,
    ):
        self.workers = max(1, int(workers))
        self.host_limits = dict(host_limits or {})
        self.retries = retries
        self.backoff = backoff
        self.timeout = timeout
        self.open_file = open_file
        self.stream = stream
        self.deadlines = deadlines or Deadlines()
        self._slots: dict[str, threading.BoundedSemaphore] = {}
        self._slots_lock = threading.Lock()
        self._cancel = threading.Event()

    # ---- per-host connection cap ----------------------------------------------------------
    def _slot(self, url: str) -> threading.BoundedSemaphore:
        host = host_of(url)
        with self._slots_lock:
            if host not in self._slots:
                limit = min(self.workers, int(self.host_limits.get(host, self.workers)))
                self._slots[host] = threading.BoundedSemaphore(max(1, limit))
            return self._slots[host]

    # ---- one file ----------------------------------------------------------------------------
    def fetch(self, item: Item, progress: Progress | None = None) -> Fetched:
        dest = Path(item.dest)
        if dest.is_file():
            try:
                return Fetched(item, check_bytes(dest, item, str(dest)), dest.stat().st_size, True)
            except ChecksumError:
                dest.unlink()  # a stale or altered copy: fetch it again
        dest.parent.mkdir(parents=True, exist_ok=True)
        part = _partial(dest)
        if item.local is not None:
            self._copy(item, part, progress)
        else:
            self._download(item, part, progress)
        try:
            digest = check_bytes(part, item, item.url if item.local is None else str(item.local))
        except ChecksumError:
            discard_partial(part)
            raise
        os.replace(part, dest)
        _meta(part).unlink(missing_ok=True)
        if progress:
            progress.file_done()
        return Fetched(item, digest, dest.stat().st_size, False)

    def _write_stream(self, src: IO[bytes], part: Path, mode: str, progress: Progress | None,
                      clock: _Clock | None = None, url: str = "") -> int:
        """Copy ``src`` to ``part``; every chunk that arrives is written at once (``read1``), so a read
        that times out loses nothing already received."""
        n = 0
        read = getattr(src, "read1", src.read)
        try:
            f = self.open_file(part, mode)
        except OSError as e:
            raise _WriteFailed(e) from None
        with f:
            while True:
                chunk = read(CHUNK)
                if not chunk:
                    break
                try:
                    f.write(chunk)
                    f.flush()
                except OSError as e:
                    raise _WriteFailed(e) from None
                n += len(chunk)
                if progress:
                    progress.add_bytes(len(chunk))
                if clock is not None:
                    clock.got(len(chunk))
                    self._check_rate(clock, url, part)
        return n

    def _write_failed(self, e: _WriteFailed, part: Path) -> PrepareError:
        if e.err.errno in (errno.ENOSPC, errno.EDQUOT):
            discard_partial(part)
            return DiskFullError(
                f"{part.parent}: no space left on the device while writing {part.name}; free space (or "
                "pass --data DIR on a bigger disk) and run again - nothing was laid out"
            )
        return PrepareError(f"{part}: cannot write ({e.err.strerror or e.err}); check the permissions of --data")

    def _copy(self, item: Item, part: Path, progress: Progress | None) -> None:
        assert item.local is not None
        try:
            with open(item.local, "rb") as src:
                self._write_stream(src, part, "wb", progress)
        except _WriteFailed as e:
            raise self._write_failed(e, part) from None
        except OSError as e:
            raise PrepareError(f"{item.local}: cannot read ({e.strerror or e}); check the --from copy") from None

    @staticmethod
    def _kept(part: Path) -> str:
        n = part.stat().st_size if part.exists() else 0
        return f"the {n} bytes received are kept in {part}" if n else "nothing was received"

    def _check_rate(self, clock: _Clock, url: str, part: Path) -> None:
        rate = clock.rate_shortfall()
        if rate is not None:
            d = clock.d
            raise NetworkError(
                f"{url}: too slow ({rate:.0f} B/s over the last {d.rate_window_seconds:g} s, below the minimum "
                f"{d.min_bytes_per_second:g} B/s); {self._kept(part)} - run again to resume, use --mirror or "
                "--from DIR, or lower [limits] min_bytes_per_second in a --sources file"
            )

    def _download(self, item: Item, part: Path, progress: Progress | None) -> None:
        clock = _Clock(self.deadlines)
        try:
            self._attempts(item, part, progress, clock)
        except BaseException:
            if part.exists() and part.stat().st_size == 0:
                discard_partial(part)  # never leave an empty .partial
            raise

    def _attempts(self, item: Item, part: Path, progress: Progress | None, clock: _Clock) -> None:
        url = item.url
        attempt = 0
        while True:
            if self._cancel.is_set():
                raise PrepareError(f"{url}: cancelled after another download failed")
            offset = part.stat().st_size if part.exists() else 0
            validator = _read_meta(part, url) if offset else None
            if offset and validator is None:
                discard_partial(part)  # bytes of a response that cannot be identified again: never splice
                offset = 0
            headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
            if offset:
                headers["Range"] = f"bytes={offset}-"
                headers["If-Range"] = validator
            try:
                queued = time.monotonic()
                with self._slot(url):
                    clock.pause(time.monotonic() - queued)
                    req = urllib.request.Request(url, headers=headers)
                    wait = max(0.05, min(self.timeout, clock.left()))
                    with urllib.request.urlopen(req, timeout=wait) as resp:
                        mode = "ab"
                        if offset and resp.status == 206:
                            start = _content_range_start(resp.headers.get("Content-Range"))
                            if start not in (offset, None) or not _same_file(validator, resp.headers):
                                discard_partial(part)
                                raise _Changed()
                        else:
                            # a fresh start, or a 200 to a resume (the file changed, or Range is ignored)
                            mode, offset = "wb", 0
                            _write_meta(part, url, _validator(resp.headers))
                        length = resp.headers.get("Content-Length")
                        if progress and item.size is None and item.approx is None and length and not offset:
                            progress.add_total(int(length))
                        got = self._write_stream(resp, part, mode, progress, clock, url)
                        if length is not None and got < int(length):
                            raise _Dropped()
                return
            except _WriteFailed as e:
                raise self._write_failed(e, part) from None
            except urllib.error.HTTPError as e:
                if e.code == 416 and offset:
                    if item.size is not None and offset == item.size:
                        return  # the .partial already holds everything
                    discard_partial(part)
                    reason = "HTTP 416 (the partial file does not fit the remote file)"
                elif e.code in RETRY_STATUS:
                    reason = f"HTTP {e.code} {e.reason}"
                else:
                    hint = ("the file is not there (moved or renamed upstream?): check the URL in "
                            "adjcap/prepare/sources.toml or use --from DIR with a local copy") if e.code == 404 else (
                            "the server refused it: check access, or use --from DIR with a local copy")
                    raise NetworkError(f"{url}: HTTP {e.code} {e.reason}; {hint}") from None
            except _Dropped:
                reason = "the connection dropped mid-file"
            except _Changed:
                reason = "the file changed on the server since the partial download began (starting over)"
            except (urllib.error.URLError, http.client.HTTPException, OSError) as e:
                reason = _reason(e)
            attempt += 1
            if clock.left() <= 0:
                raise NetworkError(
                    f"{url}: no data for {self.deadlines.stall_seconds:g} s ({reason}); {self._kept(part)} - "
                    "run again to resume, use --mirror or --from DIR, or raise [limits] stall_seconds "
                    "in a --sources file"
                )
            self._check_rate(clock, url, part)
            if attempt > self.retries:
                raise NetworkError(
                    f"{url}: {reason} (gave up after {self.retries} retries); check the network or proxy "
                    "and run again (it resumes), or use --from DIR with a local copy"
                )
            delay = min(self.backoff * (2 ** (attempt - 1)), 30.0)
            time.sleep(max(0.0, min(delay * (0.75 + 0.5 * random.random()), clock.left())))

    # ---- many files -----------------------------------------------------------------------
    def fetch_all(self, items: Sequence[Item], label: str) -> list[Fetched]:
        """Fetch every item (``workers`` at a time); the first failure cancels the rest and is
        raised as one line (with how many others failed)."""
        if not items:
            return []
        total = sum((it.size or it.approx or 0) for it in items) or None
        progress = Progress(label, len(items), total, stream=self.stream)
        self._cancel.clear()
        errors: list[PrepareError] = []
        results: list[Fetched | None] = [None] * len(items)

        def one(i: int) -> None:
            if self._cancel.is_set():
                return
            try:
                results[i] = self.fetch(items[i], progress)
            except PrepareError as e:
                errors.append(e)
                self._cancel.set()

        try:
            with ThreadPoolExecutor(max_workers=self.workers) as pool:
                list(pool.map(one, range(len(items))))
        finally:
            progress.close()
        if errors:
            real = [e for e in errors if "cancelled after another download failed" not in str(e)] or errors
            more = f" ({len(real) - 1} more failed)" if len(real) > 1 else ""
            raise type(real[0])(f"{real[0]}{more}")
        return [r for r in results if r is not None]

    def head_size(self, url: str) -> int | None:
        """The remote size from a HEAD request, or None (offline, no Content-Length, ...)."""
        try:
            req = urllib.request.Request(url, method="HEAD", headers={"User-Agent": USER_AGENT})
            with urllib.request.urlopen(req, timeout=min(self.timeout, 15.0)) as resp:
                n = resp.headers.get("Content-Length")
                return int(n) if n is not None else None
        except (OSError, ValueError, http.client.HTTPException):
            return None


def _content_range_start(value: str | None) -> int | None:
    # "bytes 100-999/1000"
    if not value or not value.startswith("bytes "):
        return None
    try:
        return int(value[6:].split("-", 1)[0])
    except ValueError:
        return None


def _reason(e: BaseException) -> str:
    if isinstance(e, urllib.error.URLError) and not isinstance(e, urllib.error.HTTPError):
        inner = e.reason
        return f"cannot connect ({inner.strerror if isinstance(inner, OSError) and inner.strerror else inner})"
    if isinstance(e, TimeoutError):
        return "timed out"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


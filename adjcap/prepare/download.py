"""Resumable, verified, parallel downloads (standard library only).

Each file is written to ``<dest>.partial`` and renamed to ``dest`` only after its size and sha256 were
checked, so ``dest`` is either complete or absent. A ``.partial`` left by a dropped connection or an
interrupted run is continued with an HTTP ``Range`` request. Transient faults (connection drops,
timeouts, HTTP 408/429/5xx) are retried with exponential backoff; other HTTP errors fail at once.
Connections per host are capped. ``--from DIR`` copies go through the same checks."""

from __future__ import annotations

import errno
import http.client
import os
import random
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Sequence, TextIO

from adjcap.prepare.errors import ChecksumError, DiskFullError, NetworkError, PrepareError
from adjcap.prepare.progress import Progress
from adjcap.prepare.sources import host_of
from adjcap.prepare.verify import sha256_file

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


@dataclass
class Fetched:
    item: Item
    sha256: str
    size: int
    skipped: bool  # already there and verified; nothing transferred


class _Dropped(Exception):
    """The server closed the connection before the announced length arrived."""


class _WriteFailed(Exception):
    def __init__(self, err: OSError):
        super().__init__(str(err))
        self.err = err


def _partial(dest: Path) -> Path:
    return dest.with_name(dest.name + ".partial")


def check_bytes(path: Path, item: Item, what: str) -> str:
    """sha256 of ``path`` after checking it against the item's size and sha256 (ChecksumError)."""
    size = path.stat().st_size
    if item.size is not None and size != item.size:
        raise ChecksumError(
            f"{what}: {size} bytes, expected {item.size}; the file was removed - run again, or check "
            "that the source has not changed (sources.toml)"
        )
    digest = sha256_file(path)
    if item.sha256 and digest != item.sha256.lower():
        raise ChecksumError(
            f"{what}: sha256 {digest[:16]}... does not match the expected {item.sha256[:16]}... "
            f"(sources.toml or prepare.lock.json); the file was removed and nothing was laid out - run "
            "again, or if the source really changed, delete its entry from prepare.lock.json"
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
    ):
        self.workers = max(1, int(workers))
        self.host_limits = dict(host_limits or {})
        self.retries = retries
        self.backoff = backoff
        self.timeout = timeout
        self.open_file = open_file
        self.stream = stream
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

    # ---- one file -------------------------------------------------------------------------
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
            part.unlink(missing_ok=True)
            raise
        os.replace(part, dest)
        if progress:
            progress.file_done()
        return Fetched(item, digest, dest.stat().st_size, False)

    def _write_stream(self, src: IO[bytes], part: Path, mode: str, progress: Progress | None) -> int:
        n = 0
        try:
            f = self.open_file(part, mode)
        except OSError as e:
            raise _WriteFailed(e) from None
        with f:
            while True:
                chunk = src.read(CHUNK)
                if not chunk:
                    break
                try:
                    f.write(chunk)
                except OSError as e:
                    raise _WriteFailed(e) from None
                n += len(chunk)
                if progress:
                    progress.add_bytes(len(chunk))
        return n

    def _write_failed(self, e: _WriteFailed, part: Path) -> PrepareError:
        if e.err.errno in (errno.ENOSPC, errno.EDQUOT):
            part.unlink(missing_ok=True)
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

    def _download(self, item: Item, part: Path, progress: Progress | None) -> None:
        url = item.url
        attempt = 0
        while True:
            if self._cancel.is_set():
                raise PrepareError(f"{url}: cancelled after another download failed")
            offset = part.stat().st_size if part.exists() else 0
            headers = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
            if offset:
                headers["Range"] = f"bytes={offset}-"
            try:
                with self._slot(url):
                    req = urllib.request.Request(url, headers=headers)
                    with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                        mode = "ab"
                        if offset and resp.status == 206:
                            if _content_range_start(resp.headers.get("Content-Range")) not in (offset, None):
                                part.unlink(missing_ok=True)  # resumed elsewhere: start over
                                raise _Dropped()
                        elif offset:
                            mode, offset = "wb", 0  # the server ignored Range: start over
                        length = resp.headers.get("Content-Length")
                        if progress and item.size is None and item.approx is None and length and not offset:
                            progress.add_total(int(length))
                        got = self._write_stream(resp, part, mode, progress)
                        if length is not None and got < int(length):
                            raise _Dropped()
                return
            except _WriteFailed as e:
                raise self._write_failed(e, part) from None
            except urllib.error.HTTPError as e:
                if e.code == 416 and offset:
                    if item.size is not None and offset == item.size:
                        return  # the .partial already holds everything
                    part.unlink(missing_ok=True)
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
            except (urllib.error.URLError, http.client.HTTPException, OSError) as e:
                reason = _reason(e)
            attempt += 1
            if attempt > self.retries:
                raise NetworkError(
                    f"{url}: {reason} (gave up after {self.retries} retries); check the network or proxy "
                    "and run again (it resumes), or use --from DIR with a local copy"
                )
            delay = min(self.backoff * (2 ** (attempt - 1)), 30.0)
            time.sleep(delay * (0.75 + 0.5 * random.random()))

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


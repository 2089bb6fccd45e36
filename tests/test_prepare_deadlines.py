"""Download deadlines against a loopback server on 127.0.0.1 that stalls or drips (short limits set
through ``Deadlines``): one clear line instead of minutes of retries, the bytes that did arrive kept in
the ``.partial`` for the next run (which resumes them), and no empty ``.partial`` left."""

from __future__ import annotations

import hashlib
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from adjcap.prepare.download import Downloader, Item
from adjcap.prepare.errors import NetworkError
from adjcap.prepare.limits import Deadlines

BODY = bytes(range(256)) * 256  # 64 KiB
ETAG = f'"{hashlib.sha256(BODY).hexdigest()[:16]}"'


class Slow:
    """Serves BODY; ``mode``: "ok", "stall-after" (sends ``head`` bytes then nothing), "stall-first"
    (headers, then nothing), "paced" (4 KiB every 0.1 s) or "drip" (one byte every ``drip_s``). Stalled handlers are released at exit."""

    def __init__(self, mode: str, head: int = 5000, drip_s: float = 0.05, body: bytes = BODY):
        self.mode, self.head, self.drip_s, self.body = mode, head, drip_s, body
        self.etag = f'"{hashlib.sha256(body).hexdigest()[:16]}"'
        self.release = threading.Event()
        self.requests: list[tuple[str | None, str | None]] = []  # (Range, If-Range)
        state = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                rng, if_range = self.headers.get("Range"), self.headers.get("If-Range")
                state.requests.append((rng, if_range))
                if state.mode == "503":
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                BODY = state.body  # noqa: N806
                start = int(rng[6:].split("-")[0]) if rng and if_range == state.etag else 0
                self.send_response(206 if start else 200)
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(BODY) - 1}/{len(BODY)}")
                self.send_header("ETag", state.etag)
                self.send_header("Content-Length", str(len(BODY) - start))
                self.end_headers()
                try:
                    if state.mode == "ok":
                        self.wfile.write(BODY[start:])
                    elif state.mode == "stall-after":
                        self.wfile.write(BODY[start:start + state.head])
                        self.wfile.flush()
                        state.release.wait(30)
                    elif state.mode == "stall-first":
                        self.wfile.flush()
                        state.release.wait(30)
                    elif state.mode == "paced":  # steady 4 KiB every 0.1 s: about 1.6 s a file
                        for i in range(start, len(BODY), 4096):
                            self.wfile.write(BODY[i:i + 4096])
                            self.wfile.flush()
                            time.sleep(0.1)
                    else:  # drip
                        for i in range(start, len(BODY)):
                            if state.release.is_set():
                                break
                            self.wfile.write(BODY[i:i + 1])
                            self.wfile.flush()
                            time.sleep(state.drip_s)
                except OSError:
                    pass  # the client gave up

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/files/body.bin"

    def __enter__(self) -> "Slow":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def _dl(**deadlines) -> Downloader:
    return Downloader(workers=1, retries=5, backoff=0.01, timeout=30,
                      deadlines=Deadlines(**{"stall_seconds": 1.0, "min_bytes_per_second": 0,
                                             "rate_window_seconds": 1.0, **deadlines}))


def test_a_stall_after_some_bytes_ends_at_the_deadline_and_keeps_them_for_the_resume(tmp_path):
    dest = tmp_path / "body.bin"
    part = tmp_path / "body.bin.partial"
    with Slow("stall-after", head=5000) as s:
        with pytest.raises(NetworkError) as e:
            _dl().fetch(Item(url=s.url, dest=dest))
        msg = str(e.value)
        # one attempt, not six read timeouts in a row: the deadline counts across retries
        assert len(s.requests) == 1
        assert "\n" not in msg and s.url in msg and "no data for 1 s" in msg and "run again to resume" in msg
        assert f"5000 bytes received are kept in {part}" in msg
        assert part.read_bytes() == BODY[:5000] and not dest.exists()
        s.mode = "ok"  # the server recovers
        got = _dl().fetch(Item(url=s.url, dest=dest))
        # the next run asks for the rest only, naming the first response's ETag (it did not change)
        assert s.requests[1:] == [("bytes=5000-", ETAG)]
    assert dest.read_bytes() == BODY and got.sha256 == hashlib.sha256(BODY).hexdigest()
    assert not part.exists() and not Path(f"{part}.meta").exists()


def test_a_stall_before_the_first_byte_leaves_no_empty_partial(tmp_path):
    dest = tmp_path / "body.bin"
    with Slow("stall-first") as s:
        with pytest.raises(NetworkError, match="no data for 1 s .*nothing was received"):
            _dl().fetch(Item(url=s.url, dest=dest))
        assert len(s.requests) == 1
    assert list(tmp_path.iterdir()) == []


def test_a_drip_below_the_minimum_rate_ends_with_the_bytes_kept(tmp_path):
    """One byte every 50 ms never trips a read timeout; the rate window does."""
    dest = tmp_path / "body.bin"
    part = tmp_path / "body.bin.partial"
    with Slow("drip", drip_s=0.05) as s:
        with pytest.raises(NetworkError) as e:
            _dl(stall_seconds=30, min_bytes_per_second=1000, rate_window_seconds=1.0).fetch(Item(url=s.url, dest=dest))
        assert len(s.requests) == 1
    msg = str(e.value)
    assert "\n" not in msg and s.url in msg and "too slow" in msg and "below the minimum 1000 B/s" in msg
    kept = part.read_bytes()
    assert 0 < len(kept) < len(BODY) and kept == BODY[: len(kept)]
    assert f"the {len(kept)} bytes received are kept" in msg


def test_waiting_for_a_host_slot_is_not_a_stall(tmp_path):
    """Two files, one connection allowed to the host: the second waits longer than the stall deadline
    for the first to finish, and still completes."""
    with Slow("paced") as s:
        dl = Downloader(workers=2, host_limits={"127.0.0.1:" + s.url.split(":")[2].split("/")[0]: 1},
                        retries=1, backoff=0.01, timeout=30,
                        deadlines=Deadlines(stall_seconds=1.0, min_bytes_per_second=0, rate_window_seconds=1.0))
        items = [Item(url=s.url, dest=tmp_path / f"{i}.bin") for i in range(2)]
        got = dl.fetch_all(items, "two")
    assert [g.sha256 for g in got] == [hashlib.sha256(BODY).hexdigest()] * 2
    assert len(s.requests) == 2  # neither was retried


def test_retries_end_at_the_stall_deadline_too(tmp_path):
    """A server that only answers 503: with many retries allowed, the stall deadline still ends it,
    in one line naming the last reason."""
    with Slow("503") as s:
        dl = Downloader(workers=1, retries=1000, backoff=0.2, timeout=30,
                        deadlines=Deadlines(stall_seconds=1.0, min_bytes_per_second=1000, rate_window_seconds=0.5))
        with pytest.raises(NetworkError) as e:
            dl.fetch(Item(url=s.url, dest=tmp_path / "body.bin"))
        assert 1 < len(s.requests) < 1000
    msg = str(e.value)
    assert "\n" not in msg and "no data for 1 s (HTTP 503" in msg and "nothing was received" in msg
    assert list(tmp_path.iterdir()) == []


def test_an_empty_file_is_a_valid_download(tmp_path):
    with Slow("ok", body=b"") as s:
        got = _dl().fetch(Item(url=s.url, dest=tmp_path / "empty.bin"))
    assert got.size == 0 and (tmp_path / "empty.bin").read_bytes() == b""

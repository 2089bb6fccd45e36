"""What a killed `adjcap prepare` leaves behind is dealt with by the next run that holds the data folder's
run lock: a real subprocess is killed (SIGKILL) mid-download against a loopback server that stalls; its
``.partial`` is resumed with ``If-Range``; crafted leftovers (a half-extracted ``.extract-*`` folder, a
tree renamed aside by a replacement, stale temporary files, unresumable partials) are removed or put back;
a second run while the first is alive is refused and touches nothing."""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from adjcap.prepare import Options, PrepareError, run
from adjcap.prepare.runlock import RUN_LOCK_NAME
from test_prepare_deadlines import Slow

ZIP_DIR = "stanford-corenlp-full-2015-12-09"
JARS = ("stanford-corenlp-3.6.0.jar", "stanford-corenlp-3.6.0-models.jar")


def _corenlp_zip() -> bytes:
    """A tiny stand-in for the CoreNLP zip: the two jars, stored (incompressible bytes, ~64 KiB)."""
    rnd = random.Random(7)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for jar in JARS:
            z.writestr(f"{ZIP_DIR}/{jar}", rnd.randbytes(32 * 1024))
    return buf.getvalue()


def _sources(path: Path, url: str, body: bytes) -> Path:
    path.write_text(f'[spice]\nurl = "{url}"\nsha1 = "{hashlib.sha1(body).hexdigest()}"\n')
    return path


def _wait_for(cond, what: str, proc: subprocess.Popen, limit: float = 60.0) -> None:
    end = time.monotonic() + limit
    while not cond():
        if proc.poll() is not None:
            raise AssertionError(f"the first run ended ({proc.returncode}): {proc.stderr.read().decode()[-2000:]}")
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _craft_leftovers(data: Path) -> dict[str, Path]:
    """Leftovers of killed runs at the places `adjcap prepare` writes them."""
    half = data / "spice" / ".extract-k1ll3d" / ZIP_DIR
    half.mkdir(parents=True)
    (half / JARS[0]).write_bytes(b"half a jar")
    (data / ".prepare.lock-abc.json").write_text("{")
    dl = data / ".prepare" / "downloads"
    dl.mkdir(parents=True, exist_ok=True)
    (dl / "orphan.zip.partial.meta").write_text(json.dumps({"url": "http://x/orphan.zip", "if_range": '"e"'}))
    (dl / "old.zip.partial").write_bytes(b"an older adjcap's partial, no .meta")
    (dl / "empty.zip.partial").write_bytes(b"")
    (dl / "done.zip").write_bytes(b"finished")
    (dl / "done.zip.partial").write_bytes(b"fini")
    (dl / "done.zip.partial.meta").write_text(json.dumps({"url": "http://x/done.zip", "if_range": '"e"'}))
    # extract.place killed between its two renames: the previous tree is aside and the final name is free
    aside = data / "nltk_data" / "corpora" / ".wordnet.old-4242"
    aside.mkdir(parents=True)
    (aside / "lexnames").write_text("the previous tree")
    # a replaced tree the kill left aside after the new one was in place
    (data / "nltk_data" / "taggers" / "tagger").mkdir(parents=True)
    (data / "nltk_data" / "taggers" / ".tagger.old-4243").mkdir()
    # a folder with its own run lock (an evaluation's SPICE jars in a cache inside {data}) is not ours
    other = data / "cache" / "lib" / ".extract-live"
    other.mkdir(parents=True)
    (other.parent / RUN_LOCK_NAME).write_text("pid 1 on host elsewhere")
    return {"half": half.parent, "aside": aside, "dl": dl}


def test_a_killed_run_is_resumed_and_its_leftovers_cleaned_by_the_next_run(tmp_path):
    body = _corenlp_zip()
    data = tmp_path / "data"
    with Slow("stall-after", head=5000, body=body) as s:
        sources = _sources(tmp_path / "sources.toml", s.url, body)
        code = ("from adjcap.prepare import Options, run; "
                f"run(['spice'], Options(data={str(data)!r}, sources={str(sources)!r}, retries=0))")
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            part = data / ".prepare" / "downloads" / (s.url.rsplit("/", 1)[-1] + ".partial")
            _wait_for(lambda: part.is_file() and part.stat().st_size >= 5000 and Path(f"{part}.meta").is_file(),
                      "the first run's partial download", proc)
            left = _craft_leftovers(data)
            # while the first run lives, a second one is refused and touches nothing of it
            with pytest.raises(PrepareError, match=rf"is being prepared by pid {proc.pid} on host .*{RUN_LOCK_NAME}"):
                run(["spice"], Options(data=data, sources=sources), say=lambda _: None, stream=io.StringIO())
            assert left["half"].is_dir() and (left["dl"] / "old.zip.partial").exists() and part.exists()
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        assert proc.returncode == -signal.SIGKILL
        assert part.read_bytes() == body[:5000]
        s.mode = "ok"
        lines: list[str] = []
        run(["spice"], Options(data=data, sources=sources, retries=0), say=lines.append, stream=io.StringIO())
        # the killed run's bytes were resumed, naming the ETag of the response they came from
        assert s.requests[1:] == [("bytes=5000-", s.etag)]
    lib = data / "spice" / "lib"
    with zipfile.ZipFile(io.BytesIO(body)) as z:
        for jar in JARS:
            assert (lib / jar).read_bytes() == z.read(f"{ZIP_DIR}/{jar}")
    lock = json.loads((data / "prepare.lock.json").read_text())
    assert [r["sha256"] for r in lock["downloads"].values()] == [hashlib.sha256(body).hexdigest()]
    # every leftover is gone, except the tree a kill had left aside: it is back in place
    assert not left["half"].exists() and not (data / ".prepare.lock-abc.json").exists()
    # the spice download went once laid out; of the crafted ones only a finished download (another
    # step's, checked again when that step runs) stays
    assert sorted(p.relative_to(data).as_posix() for p in (data / ".prepare").rglob("*") if p.is_file()) == [
        ".prepare/downloads/done.zip"]
    assert (data / "nltk_data" / "corpora" / "wordnet" / "lexnames").read_text() == "the previous tree"
    assert sorted(p.name for p in (data / "nltk_data" / "taggers").iterdir()) == ["tagger"]
    assert (data / "cache" / "lib" / ".extract-live").is_dir()
    said = [s for s in lines if "leftovers of an earlier run" in s]
    assert len(said) == 1 and ".extract-k1ll3d" in said[0]
    assert any("1 partial download(s) of an earlier run kept to resume" in s for s in lines)


def test_a_resumable_partial_of_a_step_not_run_now_is_kept_for_it(tmp_path):
    body = _corenlp_zip()
    data = tmp_path / "data"
    dl = data / ".prepare" / "downloads"
    dl.mkdir(parents=True)
    keep = dl / "punkt_tab.zip.partial"
    keep.write_bytes(b"x" * 100)
    Path(f"{keep}.meta").write_text(json.dumps({"url": "http://h/punkt_tab.zip", "if_range": '"v1"'}))
    with Slow("ok", body=body) as s:
        sources = _sources(tmp_path / "sources.toml", s.url, body)
        run(["spice"], Options(data=data, sources=sources, retries=0), say=lambda _: None, stream=io.StringIO())
    assert keep.read_bytes() == b"x" * 100 and Path(f"{keep}.meta").exists()
    assert (data / "spice" / "lib" / JARS[0]).is_file()

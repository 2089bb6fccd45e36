"""`adjcap prepare` against a local HTTP server on 127.0.0.1 (no internet): sources laid out like the
real ones (<host>/<path>, reached through --mirror), with faults: a connection cut mid-file, 500s and
404s, a wrong checksum, unsafe archives, a full disk; plus --from, --dry-run, --verify and the models
step against a Hugging Face cache holding a tiny model."""

from __future__ import annotations

import email.utils
import errno
import hashlib
import io
import json
import socket
import stat
import tarfile
import threading
import time
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from PIL import Image

from adjcap.prepare import Options, PrepareError, run
from adjcap.prepare.errors import ChecksumError, DiskFullError, NetworkError, UnsafeArchiveError
from adjcap.prepare.extract import check_archive


# --------------------------------------------------------------------------------------------
# the server: bytes by path (<host>/<path>), Range, a cut connection, error statuses first
# --------------------------------------------------------------------------------------------

class State:
    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.drop_once: set[str] = set()  # first full GET of these paths is cut halfway
        self.statuses: dict[str, list[int]] = {}  # answered (in order) before the file is served
        self.log: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        self.lock = threading.Lock()
        self.delay = 0.0  # seconds each GET takes (to see concurrency)
        self.etags = True  # send a strong ETag (and honour If-Range against it)
        self.last_modified = False  # send Last-Modified instead of an ETag (honoured the same way)
        self.ignore_range: set[str] = set()  # paths whose Range requests get the whole file (200)
        self.ignore_if_range: set[str] = set()  # paths served from the offset whatever If-Range says
        self.after_drop: dict[str, bytes] = {}  # the file changes to these bytes right after the cut
        self.if_ranges: list[str | None] = []  # the If-Range header of every GET with a Range
        self.in_flight = 0
        self.max_in_flight = 0

    def gets(self, path: str) -> list[str | None]:
        return [r for m, p, r in self.log if m == "GET" and p == path]


def _handler(state: State):
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):  # quiet
            pass

        def _serve(self, head: bool) -> None:
            path = self.path.split("?", 1)[0]
            rng = self.headers.get("Range")
            with state.lock:
                state.log.append(("HEAD" if head else "GET", path, rng))
                queued = state.statuses.get(path)
                status = queued.pop(0) if queued else None
                drop = not head and path in state.drop_once and rng is None
                if drop:
                    state.drop_once.discard(path)
            if status is not None:
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body = state.files.get(path)
            if body is None:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            start = 0
            digest = hashlib.sha256(body).hexdigest()
            etag = f'"{digest[:20]}"'
            if state.last_modified:  # a date that changes with the content
                etag = email.utils.formatdate(1_700_000_000 + int(digest[:6], 16), usegmt=True)
            if rng and not head:
                if_range = self.headers.get("If-Range")
                with state.lock:
                    state.if_ranges.append(if_range)
                if path in state.ignore_range or (
                        if_range is not None and if_range != etag and path not in state.ignore_if_range):
                    rng = None  # RFC 9110: a validator that does not match gets the whole file
            if rng and rng.startswith("bytes=") and not head:
                start = int(rng[6:].split("-", 1)[0])
                if start >= len(body):
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(body)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
            else:
                self.send_response(200)
            self.send_header("Accept-Ranges", "bytes")
            if state.last_modified:
                self.send_header("Last-Modified", etag)
            elif state.etags:
                self.send_header("ETag", etag)
            self.send_header("Content-Length", str(len(body) - start))
            self.end_headers()
            if head:
                return
            if not head and state.delay:
                with state.lock:
                    state.in_flight += 1
                    state.max_in_flight = max(state.max_in_flight, state.in_flight)
                time.sleep(state.delay)
                with state.lock:
                    state.in_flight -= 1
            if drop:
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                with state.lock:
                    if path in state.after_drop:
                        state.files[path] = state.after_drop.pop(path)
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            self.wfile.write(body[start:])

        def do_GET(self):
            self._serve(False)

        def do_HEAD(self):
            self._serve(True)

    return H


class Server:
    def __init__(self) -> None:
        self.state = State()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self.state))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> "Server":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# --------------------------------------------------------------------------------------------
# a small world laid out like the real sources
# --------------------------------------------------------------------------------------------

GH = "/github.com/boreng0817/IFCap/releases/download/v1.0"
COCO_IMG = "/images.cocodataset.org/val2014"
NOCAPS_ANN = "/nocaps.s3.amazonaws.com/nocaps_val_4500_captions.json"
NLTK = "/raw.githubusercontent.com/nltk/nltk_data/gh-pages/packages"
CORENLP = "/nlp.stanford.edu/software/stanford-corenlp-full-2015-12-09.zip"

COCO_TEST = [f"COCO_val2014_{i:012d}.jpg" for i in (391895, 522418, 184613)]
COCO_VAL = [f"COCO_val2014_{i:012d}.jpg" for i in (318219, 554625)]
FLICKR_TEST = ["1007129816.jpg", "1009434119.jpg"]
FLICKR_VAL = ["1012212859.jpg"]

# the published counts shrunk to this world (a --sources file, as a user would override them)
SOURCES_TOML = """
[ifcap.annotations.expect]
"coco/test_captions.json" = 3
"coco/val_captions.json" = 2
"coco/train_captions.json" = 0
"flickr30k/test_captions.json" = 2
"flickr30k/val_captions.json" = 1
"flickr30k/train_captions.json" = 0
"nocaps/nocaps_corpus.json" = 3
[coco.expect]
test = 3
val = 2
[flickr30k.expect]
test = 2
val = 1
[nocaps]
expect = 3
"""


def jpeg(seed: int) -> bytes:
    im = Image.new("RGB", (24, 16), ((seed * 40) % 256, (seed * 90) % 256, 128))
    buf = io.BytesIO()
    im.save(buf, format="JPEG")
    return buf.getvalue()


def zip_bytes(entries: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in entries.items():
            z.writestr(name, data)
    return buf.getvalue()


def annotations_zip() -> bytes:
    caps = lambda names: json.dumps({n: [f"a photo {i}", f"an image {i}"] for i, n in enumerate(names)}).encode()
    nocaps = json.dumps([{"split": d, "image_id": f"{i}.jpg", "caption": ["x"]}
                         for i, d in enumerate(["in_domain", "near_domain", "out_domain"])]).encode()
    return zip_bytes({
        "annotations/coco/test_captions.json": caps(COCO_TEST),
        "annotations/coco/val_captions.json": caps(COCO_VAL),
        "annotations/coco/train_captions.json": caps(["t1.jpg"]),
        "annotations/flickr30k/test_captions.json": caps(FLICKR_TEST),
        "annotations/flickr30k/val_captions.json": caps(FLICKR_VAL),
        "annotations/flickr30k/train_captions.json": caps(["t2.jpg"]),
        "annotations/nocaps/nocaps_corpus.json": nocaps,
    })


def checkpoints_zip() -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save({"mapping.weight": torch.arange(6.0).reshape(2, 3)}, buf)
    return zip_bytes({"train_coco/coco-indomain-004.pt": buf.getvalue()})


def nocaps_json() -> bytes:
    images = [{"id": i, "file_name": f"{oid}.jpg", "open_images_id": oid, "domain": d,
               "coco_url": f"https://s3.amazonaws.com/nocaps/val/{oid}.jpg"}
              for i, (oid, d) in enumerate([("0013ea2087020901", "in-domain"), ("00223d9ac2ae1d6a", "near-domain"),
                                            ("0024a0c6fd3e1bd8", "out-domain")])]
    return json.dumps({"images": images, "annotations": []}).encode()


def world_files() -> dict[str, bytes]:
    files = {f"{GH}/annotations.zip": annotations_zip(), f"{GH}/checkpoints.zip": checkpoints_zip()}
    for i, n in enumerate(COCO_TEST + COCO_VAL):
        files[f"{COCO_IMG}/{n}"] = jpeg(i)
    files[NOCAPS_ANN] = nocaps_json()
    for im in json.loads(files[NOCAPS_ANN])["images"]:
        files["/" + im["coco_url"].split("://", 1)[1]] = jpeg(20 + im["id"])
    files[f"{NLTK}/tokenizers/punkt_tab.zip"] = zip_bytes({"punkt_tab/english/collocations.tab": b"x\ty\n"})
    files[f"{NLTK}/taggers/averaged_perceptron_tagger_eng.zip"] = zip_bytes(
        {"averaged_perceptron_tagger_eng/averaged_perceptron_tagger_eng.weights.json": b"{}"})
    files[f"{NLTK}/corpora/wordnet.zip"] = zip_bytes({"wordnet/lexnames": b"00 adj.all 3\n"})
    files[CORENLP] = zip_bytes({
        "stanford-corenlp-full-2015-12-09/stanford-corenlp-3.6.0.jar": zip_bytes({"META-INF/MANIFEST.MF": b"a"}),
        "stanford-corenlp-full-2015-12-09/stanford-corenlp-3.6.0-models.jar": zip_bytes({"m": b"b"}),
        "stanford-corenlp-full-2015-12-09/README.txt": b"not kept",
    })
    return files


@pytest.fixture(scope="module")
def world():
    return world_files()


@pytest.fixture
def server(world):
    with Server() as s:
        s.state.files.update(world)
        yield s


@pytest.fixture
def sources(tmp_path, world):
    """The counts of this world, and the sha1 of its CoreNLP zip in place of the published one."""
    p = tmp_path / "sources.toml"
    p.write_text(SOURCES_TOML + f'[spice]\nsha1 = "{hashlib.sha1(world[CORENLP]).hexdigest()}"\n')
    return p


def opts(data: Path, sources: Path, server: Server | None = None, **kw) -> Options:
    kw.setdefault("workers", 4)
    return Options(data=data, sources=sources, mirror=server.url if server else None, backoff=0.01,
                   retries=3, timeout=10, **kw)


def quiet(lines: list[str] | None = None):
    return (lambda s: lines.append(s)) if lines is not None else (lambda s: None)


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


# --------------------------------------------------------------------------------------------
# the whole thing
# --------------------------------------------------------------------------------------------


def test_full_prepare_lays_out_everything_where_the_presets_look(tmp_path, server, sources, monkeypatch):
    data = tmp_path / "data"
    run(["ifcap", "coco", "nocaps", "nltk", "spice"], opts(data, sources, server), say=quiet(), stream=io.StringIO())

    ann = data / "ifcap/annotations/coco/test_captions.json"
    assert ann.is_file() and (data / "ifcap/annotations/nocaps/nocaps_corpus.json").is_file()
    ckpt = data / "ifcap/checkpoints/train_coco/coco-indomain-004.pt"
    import torch

    assert torch.load(ckpt, weights_only=True)["mapping.weight"].shape == (2, 3)
    # the benchmark reader finds every Karpathy image it needs, at the preset's paths
    from adjcap.data.benchmarks import read_benchmark

    for split, names in (("test", COCO_TEST), ("val", COCO_VAL)):
        recs = read_benchmark("ifcap", data / f"ifcap/annotations/coco/{split}_captions.json",
                              data / "coco/val2014", split)
        assert sorted(Path(r.image_path).name for r in recs) == sorted(names)
    assert sorted(p.name for p in (data / "nocaps/val").iterdir()) == ["0.jpg", "1.jpg", "2.jpg"]
    assert sorted(p.name for p in (data / "spice/lib").glob("*.jar")) == [
        "stanford-corenlp-3.6.0-models.jar", "stanford-corenlp-3.6.0.jar"]
    # SPICE will run these jars: extracted from a zip whose sha1 was checked, recorded in a private manifest
    from adjcap.java.trust import read_manifest

    assert sorted(read_manifest(data / "spice/lib")) == ["stanford-corenlp-3.6.0-models.jar",
                                                         "stanford-corenlp-3.6.0.jar"]
    assert (data / "spice/lib").stat().st_mode & 0o077 == 0
    # entities finds the NLTK data in {data}/nltk_data through ADJCAP_DATA
    import nltk

    from adjcap.models.entities import missing_nltk_resources

    monkeypatch.setattr(nltk.data, "path", [])
    monkeypatch.delenv("ADJCAP_NLTK_DATA", raising=False)
    monkeypatch.delenv("NLTK_DATA", raising=False)
    monkeypatch.setenv("ADJCAP_DATA", str(data))
    assert missing_nltk_resources() == []
    # nothing half-done is left around, and the lock holds the true sha256 of what was laid out
    assert not (data / ".prepare").exists()  # no .partial, no staging, no archive left
    lock = json.loads((data / "prepare.lock.json").read_text())
    img = data / "coco/val2014" / COCO_TEST[0]
    assert lock["files"][f"coco/val2014/{COCO_TEST[0]}"]["sha256"] == sha(img)
    assert lock["files"]["ifcap/checkpoints/train_coco/coco-indomain-004.pt"]["sha256"] == sha(ckpt)
    url = "https://github.com/boreng0817/IFCap/releases/download/v1.0/annotations.zip"
    assert lock["downloads"][url]["sha256"] == hashlib.sha256(server.state.files[f"{GH}/annotations.zip"]).hexdigest()

    # a second run finds everything present and fetches nothing
    before = len(server.state.log)
    lines: list[str] = []
    run(["ifcap", "coco", "nocaps", "nltk", "spice"], opts(data, sources, server), say=quiet(lines), stream=io.StringIO())
    assert len(server.state.log) == before
    assert any("present" in s for s in lines)
    run([], opts(data, sources, server), verify=True, say=quiet())


def test_resume_after_a_dropped_connection_continues_the_partial(tmp_path, server, sources):
    path = f"{GH}/annotations.zip"
    server.state.drop_once.add(path)
    data = tmp_path / "data"
    run(["ifcap"], opts(data, sources, server), say=quiet(), stream=io.StringIO())
    ranges = server.state.gets(path)
    half = len(server.state.files[path]) // 2
    assert ranges == [None, f"bytes={half}-"]  # the second request continued the .partial
    got = data / "ifcap/annotations/coco/val_captions.json"
    assert json.loads(got.read_text()).keys() == set(COCO_VAL)


def test_checksum_mismatch_is_refused_and_nothing_is_laid_out(tmp_path, server, sources):
    sources.write_text(SOURCES_TOML + '\n[ifcap.annotations]\nsha256 = "' + "0" * 64 + '"\n')
    data = tmp_path / "data"
    with pytest.raises(ChecksumError, match="sha256 .* does not match"):
        run(["ifcap"], opts(data, sources, server), say=quiet(), stream=io.StringIO())
    assert not (data / "ifcap").exists()
    assert not [p for p in (data / ".prepare").rglob("*") if p.is_file()]  # no .partial, no archive


def test_locked_checksum_pins_a_source_without_a_published_one(tmp_path, server, sources):
    data = tmp_path / "data"
    run(["nltk"], opts(data, sources, server), say=quiet(), stream=io.StringIO())
    # upstream changes under the same URL: the lock (from the first download) refuses the new bytes
    path = f"{NLTK}/corpora/wordnet.zip"
    server.state.files[path] = zip_bytes({"wordnet/lexnames": b"changed\n"})
    import shutil

    shutil.rmtree(data / "nltk_data/corpora/wordnet")
    with pytest.raises(ChecksumError):
        run(["nltk"], opts(data, sources, server), say=quiet(), stream=io.StringIO())
    assert not (data / "nltk_data/corpora/wordnet").exists()


def test_server_errors_then_recovery(tmp_path, server, sources):
    data = tmp_path / "data"
    img = f"{COCO_IMG}/{COCO_VAL[0]}"
    server.state.statuses[img] = [500, 503]
    ann = f"{GH}/annotations.zip"
    server.state.statuses[ann] = [404]
    with pytest.raises(NetworkError) as e:
        run(["ifcap"], opts(data, sources, server), say=quiet(), stream=io.StringIO())
    msg = str(e.value)
    assert "annotations.zip: HTTP 404" in msg and "\n" not in msg
    assert not (data / "ifcap").exists()
    # the server recovered: the same command now succeeds; the 5xx answers are retried within the run
    run(["ifcap", "coco"], opts(data, sources, server), say=quiet(), stream=io.StringIO())
    assert len(server.state.gets(img)) == 3
    assert (data / "coco/val2014" / COCO_VAL[0]).is_file()


def test_unsafe_archives_are_refused(tmp_path, server, sources):
    evil = {
        "dotdot": zip_bytes({"punkt_tab/ok.txt": b"ok", "../escaped.txt": b"x"}),
        "absolute": zip_bytes({"/tmp/adjcap-absolute-escape.txt": b"x"}),
    }
    link = io.BytesIO()
    with zipfile.ZipFile(link, "w") as z:
        info = zipfile.ZipInfo("punkt_tab/link")
        info.external_attr = (stat.S_IFLNK | 0o777) << 16
        z.writestr(info, "/etc/passwd")
    evil["symlink"] = link.getvalue()
    for name, body in evil.items():
        p = tmp_path / f"{name}.zip"
        p.write_bytes(body)
        with pytest.raises(UnsafeArchiveError):
            check_archive(p)
    for kind in (tarfile.SYMTYPE, tarfile.CHRTYPE):
        p = tmp_path / f"{kind!r}.tar"
        with tarfile.open(p, "w") as t:
            ti = tarfile.TarInfo("pkg/x")
            ti.type = kind
            ti.linkname = "/etc/passwd"
            t.addfile(ti)
        with pytest.raises(UnsafeArchiveError):
            check_archive(p)
    # through the whole step: refused before anything is written, nothing escapes, nothing laid out
    server.state.files[f"{NLTK}/tokenizers/punkt_tab.zip"] = evil["dotdot"]
    data = tmp_path / "data"
    with pytest.raises(UnsafeArchiveError, match=r"'\.\./escaped\.txt'"):
        run(["nltk"], opts(data, sources, server), say=quiet(), stream=io.StringIO())
    assert not (data / "nltk_data/tokenizers").exists()
    assert not list(tmp_path.rglob("escaped.txt"))
    assert not Path("/tmp/adjcap-absolute-escape.txt").exists()


class _FullDisk:
    """A writer that fails with ENOSPC once ``budget`` bytes are written (a full disk)."""

    budget = 1500

    def __init__(self, path, mode):
        self.f = open(path, mode)

    def write(self, b):
        if self.f.tell() + len(b) > self.budget:
            raise OSError(errno.ENOSPC, "No space left on device")
        return self.f.write(b)

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.f.close()


def test_disk_full_is_a_clear_error_and_nothing_is_laid_out(tmp_path, server, sources):
    data = tmp_path / "data"
    with pytest.raises(DiskFullError, match="no space left"):
        run(["ifcap"], opts(data, sources, server), say=quiet(), stream=io.StringIO(), open_file=_FullDisk)
    assert not (data / "ifcap").exists()
    assert not list(data.rglob("*.partial"))


def test_from_dir_lays_out_local_copies_with_the_same_checks(tmp_path, world, sources):
    src = tmp_path / "nfs"
    (src / "release").mkdir(parents=True)
    (src / "release/annotations.zip").write_bytes(world[f"{GH}/annotations.zip"])
    (src / "release/checkpoints.zip").write_bytes(world[f"{GH}/checkpoints.zip"])
    (src / "val2014").mkdir()
    for n in COCO_TEST + COCO_VAL:
        (src / "val2014" / n).write_bytes(world[f"{COCO_IMG}/{n}"])
    (src / "flickr30k-images").mkdir()
    for i, n in enumerate(FLICKR_TEST + FLICKR_VAL + ["999.jpg"]):
        (src / "flickr30k-images" / n).write_bytes(jpeg(50 + i))
    data = tmp_path / "data"
    run(["ifcap", "coco", "flickr30k"], opts(data, sources, None, from_dir=src), say=quiet(), stream=io.StringIO())
    assert sorted(p.name for p in (data / "flickr30k/images").iterdir()) == sorted(FLICKR_TEST + FLICKR_VAL)
    assert (data / "coco/val2014" / COCO_VAL[1]).read_bytes() == world[f"{COCO_IMG}/{COCO_VAL[1]}"]
    lock = json.loads((data / "prepare.lock.json").read_text())
    assert lock["files"][f"flickr30k/images/{FLICKR_VAL[0]}"]["source"].startswith(str(src))
    # a damaged local copy is refused like a bad download
    (src / "flickr30k-images" / FLICKR_TEST[0]).write_bytes(b"not a jpeg")
    (data / "flickr30k/images" / FLICKR_TEST[0]).unlink()
    with pytest.raises(PrepareError, match="do not decode"):
        run(["flickr30k"], opts(data, sources, None, from_dir=src), say=quiet(), stream=io.StringIO())
    assert not (data / "flickr30k/images" / FLICKR_TEST[0]).exists()


def test_flickr30k_without_from_says_where_the_images_come_from(tmp_path, sources):
    with pytest.raises(PrepareError, match="no public download.*--from DIR"):
        run(["flickr30k"], opts(tmp_path / "d", sources), say=quiet())


def test_parallel_downloads_respect_the_per_host_cap_and_report_progress(tmp_path, server):
    from adjcap.prepare.download import Downloader, Item

    server.state.delay = 0.15
    items = [Item(url=f"{server.url}{COCO_IMG}/{n}", dest=tmp_path / n) for n in COCO_TEST + COCO_VAL]
    out = io.StringIO()
    host = server.url.split("://", 1)[1]
    Downloader(workers=4, host_limits={host: 2}, stream=out).fetch_all(items, "imgs")
    assert server.state.max_in_flight == 2
    assert all((tmp_path / n).read_bytes() == server.state.files[f"{COCO_IMG}/{n}"] for n in COCO_TEST + COCO_VAL)
    assert "imgs: 5/5 files" in out.getvalue() and "/s" in out.getvalue()
    server.state.max_in_flight = 0
    Downloader(workers=4, stream=io.StringIO()).fetch_all(
        [Item(url=f"{server.url}{COCO_IMG}/{n}", dest=tmp_path / "b" / n) for n in COCO_TEST + COCO_VAL], "imgs")
    assert server.state.max_in_flight == 4


def test_dry_run_lists_sources_and_total_and_writes_nothing(tmp_path, server, sources):
    data = tmp_path / "data"
    lines: list[str] = []
    run(["ifcap", "nocaps", "spice"], opts(data, sources, server, dry_run=True), say=quiet(lines))
    text = "\n".join(lines)
    assert f"{server.url}{GH}/annotations.zip" in text and str(data / "ifcap/annotations") in text
    size = len(server.state.files[f"{GH}/annotations.zip"]) + len(server.state.files[f"{GH}/checkpoints.zip"])
    assert "total to fetch" in lines[-1]
    assert not data.exists()
    assert not [m for m, _, _ in server.state.log if m == "GET"]
    assert size > 0


def test_verify_finds_an_altered_file(tmp_path, server, sources):
    data = tmp_path / "data"
    run(["ifcap", "coco"], opts(data, sources, server), say=quiet(), stream=io.StringIO())
    run(["coco"], opts(data, sources, server), verify=True, say=quiet())
    target = data / "coco/val2014" / COCO_TEST[1]
    target.write_bytes(target.read_bytes()[:-7] + b"\x00" * 7)
    lines: list[str] = []
    with pytest.raises(PrepareError, match=f"coco/val2014/{COCO_TEST[1]}: sha256 differs"):
        run([], opts(data, sources, server), verify=True, say=quiet(lines))
    assert any(COCO_TEST[1] in s for s in lines)


# --------------------------------------------------------------------------------------------
# models: the loaders' offline caches
# --------------------------------------------------------------------------------------------


def _hf_cache_with(cache: Path, repo: str, files_dir: Path) -> None:
    """Put a saved model directory into a Hugging Face cache layout (refs/main -> snapshot)."""
    base = cache / f"models--{repo.replace('/', '--')}"
    rev = "0123456789abcdef0123456789abcdef01234567"
    snap = base / "snapshots" / rev
    snap.mkdir(parents=True)
    for f in files_dir.iterdir():
        (snap / f.name).write_bytes(f.read_bytes())
    (base / "refs").mkdir()
    (base / "refs/main").write_text(rev)


def test_models_in_the_hf_cache_are_found_without_network(tmp_path, sources, monkeypatch):
    from adjcap.demo.tiny_blip import build_tiny_blip
    from adjcap.models.blip import load_verifier
    from adjcap.demo.tiny_clip import build_tiny_clip

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cache = tmp_path / "hf"
    blip = build_tiny_blip(tmp_path / "tiny-blip", ["a dog on a mat", "two cats", "a red bus"] * 20)
    _hf_cache_with(cache, "adjcap-test/tiny-blip", blip)
    clip_file = build_tiny_clip(tmp_path / "tiny-clip.safetensors")
    clip_dir = tmp_path / "clip-snap"
    clip_dir.mkdir()
    (clip_dir / "open_clip_model.safetensors").write_bytes(Path(clip_file).read_bytes())
    _hf_cache_with(cache, "timm/vit_base_patch32_clip_224.openai", clip_dir)
    tok = tmp_path / "gpt2-tok"
    tok.mkdir()
    (tok / "vocab.json").write_text("{}")
    sets = ["retrieval.encoder.model=ViT-B-32", "retrieval.encoder.pretrained=openai",
            "eval.clipscore.model=ViT-B-32", "eval.clipscore.pretrained=openai",  # the CLIPScore encoder is fetched too
            "verifier.model=adjcap-test/tiny-blip", f"captioner.tokenizer={tok}"]
    data = tmp_path / "data"
    lines: list[str] = []
    run(["models"], opts(data, sources, None, sets=sets, hf_cache_dir=str(cache)), say=quiet(lines))
    assert any("verifier adjcap-test/tiny-blip: present" in s for s in lines)
    assert any("ViT-B-32/openai: present" in s for s in lines)
    lock = json.loads((data / "prepare.lock.json").read_text())
    assert lock["models"]["hf:adjcap-test/tiny-blip"]["revision"] == "0123456789abcdef0123456789abcdef01234567"
    # what the step found is what the loader loads, offline
    ver = load_verifier("adjcap-test/tiny-blip", device="cpu", cache_dir=str(cache))
    assert ver.score_images([Image.new("RGB", (32, 32))], [["a dog"]])[0].shape == (1,)
    run(["models"], opts(data, sources, None, sets=sets, hf_cache_dir=str(cache)), verify=True, say=quiet())


def test_a_missing_model_offline_is_a_one_line_error(tmp_path, sources, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PrepareError) as e:
        run(["models"], opts(tmp_path / "data", sources, None, hf_cache_dir=str(tmp_path / "empty-hf")), say=quiet())
    msg = str(e.value)
    assert "ViT-bigG-14/laion2b_s39b_b160k" in msg and "HF_HUB_OFFLINE" in msg and "\n" not in msg


# --------------------------------------------------------------------------------------------
# the command line: one-line errors, no tracebacks
# --------------------------------------------------------------------------------------------


def test_cli_prepare_errors_are_one_line(tmp_path, server, sources):
    from typer.testing import CliRunner

    from adjcap.cli import app

    r = CliRunner().invoke(app, ["prepare", "bogus", "--data", str(tmp_path)])
    assert r.exit_code == 1 and "unknown thing to prepare 'bogus'" in r.output and "Traceback" not in r.output
    # a network fault (the file is gone from the server) names the URL, in one line
    del server.state.files[CORENLP]
    r = CliRunner().invoke(app, ["prepare", "spice", "--data", str(tmp_path / "d"), "--sources", str(sources),
                                 "--mirror", server.url])
    assert r.exit_code == 1 and "Traceback" not in r.output
    err = [s for s in r.output.splitlines() if s.startswith("error:")]
    assert len(err) == 1 and "stanford-corenlp-full-2015-12-09.zip" in err[0]
    r = CliRunner().invoke(app, ["prepare", "nltk", "--dry-run", "--data", str(tmp_path / "d2"), "--sources",
                                 str(sources), "--mirror", "http://127.0.0.1:9"])
    assert r.exit_code == 0 and "punkt_tab" in r.output and "total to fetch" in r.output


def test_a_corenlp_zip_whose_sha1_differs_is_refused(tmp_path, server, sources):
    sources.write_text(SOURCES_TOML + '[spice]\nsha1 = "' + "0" * 40 + '"\n')
    data = tmp_path / "d"
    with pytest.raises(PrepareError, match="sha1 differs"):
        run(["spice"], opts(data, sources, server), say=quiet(), stream=io.StringIO())
    assert not (data / "spice/lib/stanford-corenlp-3.6.0.jar").exists()


# --------------------------------------------------------------------------------------------
# resume never splices two versions; the lock trusts only validated bytes
# --------------------------------------------------------------------------------------------

WORDNET = f"{NLTK}/corpora/wordnet.zip"
WORDNET_URL = "https://raw.githubusercontent.com/nltk/nltk_data/gh-pages/packages/corpora/wordnet.zip"


@pytest.mark.parametrize("server_kind", ["if-range", "last-modified", "ignores-if-range", "no-validator",
                                         "ignores-range"])
def test_a_file_changed_between_a_cut_response_and_the_resume_is_fetched_afresh(tmp_path, server, sources, server_kind):
    """The first response is cut halfway and the file changes on the server before the resume: whatever
    the server does with Range / If-Range, the result is the new file whole, and the lock records its
    sha256 (never a splice of the two)."""
    old = server.state.files[WORDNET]
    new = zip_bytes({"wordnet/lexnames": b"00 adj.all 3\n01 adj.pert 3\n" * 40})
    assert len(new) != len(old) or new != old
    server.state.drop_once.add(WORDNET)
    server.state.after_drop[WORDNET] = new
    if server_kind == "ignores-if-range":
        server.state.ignore_if_range.add(WORDNET)  # 206 from the offset, with the new file's ETag
    elif server_kind == "no-validator":
        server.state.etags = False
    elif server_kind == "last-modified":
        server.state.etags, server.state.last_modified = False, True
    elif server_kind == "ignores-range":
        server.state.ignore_range.add(WORDNET)
    data = tmp_path / "data"
    run(["nltk"], opts(data, sources, server), say=quiet(), stream=io.StringIO())

    gets = server.state.gets(WORDNET)
    half = f"bytes={len(old) // 2}-"
    expected = {"if-range": [None, half], "last-modified": [None, half], "ignores-if-range": [None, half, None],
                "no-validator": [None, None], "ignores-range": [None, half]}[server_kind]
    assert gets == expected
    if server_kind != "no-validator":  # every resume names the first response's ETag (or date)
        first = hashlib.sha256(old).hexdigest()
        want = (email.utils.formatdate(1_700_000_000 + int(first[:6], 16), usegmt=True)
                if server_kind == "last-modified" else f'"{first[:20]}"')
        assert server.state.if_ranges and all(v == want for v in server.state.if_ranges)
    assert (data / "nltk_data/corpora/wordnet/lexnames").read_bytes() == b"00 adj.all 3\n01 adj.pert 3\n" * 40
    lock = json.loads((data / "prepare.lock.json").read_text())
    assert lock["downloads"][WORDNET_URL]["sha256"] == hashlib.sha256(new).hexdigest()
    assert not (data / ".prepare").exists()  # no .partial, no .meta, no archive


def _bad_crc(body: bytes) -> bytes:
    """The zip with one byte of its (stored) member data changed: the CRC check fails."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("wordnet/lexnames", body)
    raw = bytearray(buf.getvalue())
    at = raw.index(body)
    raw[at] ^= 0xFF
    return bytes(raw)


def test_a_refused_archive_never_becomes_the_trusted_sha256(tmp_path, server, sources):
    data = tmp_path / "data"
    corrupt = _bad_crc(b"00 adj.all 3\n")
    server.state.files[WORDNET] = corrupt
    with pytest.raises(PrepareError, match="CRC") as e:
        run(["nltk"], opts(data, sources, server), say=quiet(), stream=io.StringIO())
    assert "\n" not in str(e.value)
    lock = json.loads((data / "prepare.lock.json").read_text())
    assert WORDNET_URL not in lock["downloads"]  # the other packages passed: recorded; this one not
    assert not [p for p in (data / ".prepare").rglob("*") if p.is_file()] if (data / ".prepare").exists() else True
    assert not (data / "nltk_data/corpora/wordnet").exists()
    # the genuine file is then accepted and becomes the trusted value
    genuine = zip_bytes({"wordnet/lexnames": b"00 adj.all 3\n"})
    server.state.files[WORDNET] = genuine
    run(["nltk"], opts(data, sources, server), say=quiet(), stream=io.StringIO())
    lock = json.loads((data / "prepare.lock.json").read_text())
    assert lock["downloads"][WORDNET_URL]["sha256"] == hashlib.sha256(genuine).hexdigest()


def test_a_lock_entry_naming_refused_bytes_is_dropped(tmp_path, server, sources):
    """A lock written by an older version that recorded a spliced download before checking it: the same
    bytes come again, are refused, and the record goes with them; the genuine file then passes."""
    data = tmp_path / "data"
    data.mkdir()
    corrupt = _bad_crc(b"00 adj.all 3\n")
    (data / "prepare.lock.json").write_text(json.dumps({"version": 1, "files": {}, "models": {}, "downloads": {
        WORDNET_URL: {"sha256": hashlib.sha256(corrupt).hexdigest(), "size": len(corrupt), "step": "nltk"}}}))
    server.state.files[WORDNET] = corrupt
    lines: list[str] = []
    with pytest.raises(PrepareError, match="CRC"):
        run(["nltk"], opts(data, sources, server), say=quiet(lines), stream=io.StringIO())
    assert WORDNET_URL not in json.loads((data / "prepare.lock.json").read_text())["downloads"]
    assert any("record was dropped" in s for s in lines)
    server.state.files[WORDNET] = zip_bytes({"wordnet/lexnames": b"00 adj.all 3\n"})
    run(["nltk"], opts(data, sources, server), say=quiet(), stream=io.StringIO())
    assert (data / "nltk_data/corpora/wordnet/lexnames").is_file()


def test_a_wrong_locked_sha256_says_which_entry_to_delete(tmp_path, server, sources):
    data = tmp_path / "data"
    data.mkdir()
    lock_path = data / "prepare.lock.json"
    lock_path.write_text(json.dumps({"version": 1, "files": {}, "models": {}, "downloads": {
        WORDNET_URL: {"sha256": "ab" * 32, "size": 10, "step": "nltk"}}}))
    with pytest.raises(ChecksumError) as e:
        run(["nltk"], opts(data, sources, server), say=quiet(), stream=io.StringIO())
    msg = str(e.value)
    assert "\n" not in msg and f'"downloads" entry "{WORDNET_URL}" of {lock_path}' in msg
    assert "older adjcap" in msg
    # the trusted value is kept (a changed source must not replace it silently)
    assert json.loads(lock_path.read_text())["downloads"][WORDNET_URL]["sha256"] == "ab" * 32


def test_a_hostile_archive_holding_the_expected_files_is_refused_and_not_trusted(tmp_path, server, sources):
    """A tampered mirror's punkt_tab.zip: the expected folder plus a member that expands 1000 times."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        z.writestr("punkt_tab/english/collocations.tab", b"x\ty\n")
        z.writestr("punkt_tab/english/filler.bin", bytes(4 << 20))
    server.state.files[f"{NLTK}/tokenizers/punkt_tab.zip"] = buf.getvalue()
    data = tmp_path / "data"
    with pytest.raises(UnsafeArchiveError, match=r"filler\.bin.*ratio") as e:
        run(["nltk"], opts(data, sources, server), say=quiet(), stream=io.StringIO())
    assert "\n" not in str(e.value)
    url = "https://raw.githubusercontent.com/nltk/nltk_data/gh-pages/packages/tokenizers/punkt_tab.zip"
    lock = data / "prepare.lock.json"
    assert not lock.exists() or url not in json.loads(lock.read_text())["downloads"]
    assert not (data / "nltk_data/tokenizers").exists()
    assert not [p for p in data.rglob("*") if p.is_file() and p.name not in ("prepare.lock.json", ".prepare-run.lock")]


# --------------------------------------------------------------------------------------------
# coco-instances: the original CHAIR's ground truth
# --------------------------------------------------------------------------------------------

INSTANCES_ZIP = "/images.cocodataset.org/annotations/annotations_trainval2014.zip"


def _instances(ids: list[int]) -> bytes:
    return json.dumps({"images": [{"id": i} for i in ids], "categories": [{"id": 18, "name": "dog"}],
                       "annotations": [{"id": k, "image_id": i, "category_id": 18} for k, i in enumerate(ids)]}).encode()


def test_coco_instances_are_laid_out_verified_and_read_by_chair(tmp_path, server, sources):
    from adjcap.metrics.chair import load_instance_objects

    server.state.files[INSTANCES_ZIP] = zip_bytes({
        "annotations/instances_val2014.json": _instances([391895, 522418]),
        "annotations/instances_train2014.json": _instances([9]),
        "annotations/captions_val2014.json": b"{}",
    })
    with open(sources, "a") as f:  # this world's counts
        f.write('[coco_instances.expect]\n"instances_val2014.json" = 2\n"instances_train2014.json" = 1\n')
    data = tmp_path / "data"
    run(["coco-instances"], opts(data, sources, server), say=quiet(), stream=io.StringIO())
    val = data / "coco/annotations/instances_val2014.json"
    assert load_instance_objects([val]) == {391895: {"dog"}, 522418: {"dog"}}
    lock = json.loads((data / "prepare.lock.json").read_text())
    assert "coco/annotations/instances_val2014.json" in lock["files"]
    run(["coco-instances"], opts(data, sources, server), verify=True, say=quiet(), stream=io.StringIO())
    # an archive whose instances do not have the expected images is refused, nothing laid out
    other = tmp_path / "other"
    server.state.files[INSTANCES_ZIP] = zip_bytes({
        "annotations/instances_val2014.json": _instances([1]),
        "annotations/instances_train2014.json": _instances([9]),
    })
    with pytest.raises(PrepareError, match="instances_val2014.json: 1 images, expected 2"):
        run(["coco-instances"], opts(other, sources, server), say=quiet(), stream=io.StringIO())
    assert not (other / "coco/annotations").exists()

"""Hostile and damaged archives against `adjcap.prepare.extract` (crafted in the test, no network): a zip
bomb refused from its headers and, were the headers passed, while writing; duplicate names (also after
Unicode normalisation) and NUL-bearing raw names refused whole; truncated and size-lying tars one line;
nothing left behind on any refusal."""

from __future__ import annotations

import io
import json
import random
import struct
import tarfile
import unicodedata
import warnings
import zipfile
import zlib
from pathlib import Path

import pytest

from adjcap.prepare import extract as ex
from adjcap.prepare.errors import PrepareError, UnsafeArchiveError
from adjcap.prepare.limits import ExtractLimits, limits_of
from adjcap.prepare.sources import load_sources

GiB, MiB = 1 << 30, 1 << 20


def _zip(path: Path, entries: list[tuple[str, bytes]], method: int = zipfile.ZIP_DEFLATED) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about the duplicate names these tests want
        with zipfile.ZipFile(path, "w", method) as z:
            for name, data in entries:
                z.writestr(name, data)
    return path


def _left_behind(parent: Path) -> list[Path]:
    return [p for p in parent.iterdir()] if parent.exists() else []


def _deflated_zeros(mib: int) -> bytes:
    """A raw deflate stream of ``mib`` MiB of zeros, built from blocks: after a full flush over a window
    of zeros every further MiB compresses to the same bytes, so 1 GiB costs the time of 3 MiB."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = bytes(MiB)
    first = c.compress(block) + c.flush(zlib.Z_FULL_FLUSH)
    mid = c.compress(block) + c.flush(zlib.Z_FULL_FLUSH)
    assert c.compress(block) + c.flush(zlib.Z_FULL_FLUSH) == mid
    last = c.compress(block) + c.flush(zlib.Z_FINISH)
    return first + mid * (mib - 2) + last


def _raw_zip(entries: list[tuple[str, bytes, int, int, int]]) -> bytes:
    """A zip written by hand from (name, data as stored, method, crc32, uncompressed size)."""
    out, central = bytearray(), bytearray()
    for name, data, method, crc, size in entries:
        raw = name.encode()
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, method, 0, 0, crc, len(data), size,
                               len(raw), 0, 0, 0, 0, 0, len(out)) + raw
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, method, 0, 0, crc, len(data), size, len(raw), 0)
        out += raw + data
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(entries), len(entries), len(central), len(out), 0)
    return bytes(out + central + end)


@pytest.fixture(scope="module")
def bomb(tmp_path_factory) -> Path:
    """One member of 1 GiB of zeros in an archive of about 1 MiB, beside what the nltk step expects."""
    crc = 0
    for _ in range(1024):
        crc = zlib.crc32(bytes(MiB), crc)
    tab = b"x\ty\n"
    p = tmp_path_factory.mktemp("bomb") / "bomb.zip"
    p.write_bytes(_raw_zip([("punkt_tab/english/collocations.tab", tab, zipfile.ZIP_STORED, zlib.crc32(tab), len(tab)),
                            ("punkt_tab/english/zeros.bin", _deflated_zeros(1024), zipfile.ZIP_DEFLATED, crc, GiB)]))
    with zipfile.ZipFile(p) as z:  # a well-formed zip: the library reads it as such
        assert z.getinfo("punkt_tab/english/zeros.bin").file_size == GiB
        with z.open("punkt_tab/english/zeros.bin") as f:
            assert f.read(4 * MiB) == bytes(4 * MiB)
    return p


def test_a_zip_bomb_is_refused_from_its_headers_before_anything_is_written(tmp_path, bomb):
    assert bomb.stat().st_size < 2 * MiB
    out = tmp_path / "out"
    with pytest.raises(UnsafeArchiveError, match=r"zeros\.bin.*1073741824 bytes from \d+ compressed \(ratio over 200") as e:
        ex.extract(bomb, out)
    assert "\n" not in str(e.value)
    assert _left_behind(out) == []


def test_a_zip_bomb_past_the_header_check_is_stopped_while_writing(tmp_path, bomb, monkeypatch):
    """Were the header check passed (a header that lies, a future format), the byte count while writing
    stops the member far below 256 MiB, and the partial tree is removed."""
    monkeypatch.setattr(ex, "_check_sizes", lambda *a, **k: None)
    peak = [0]
    member = ex._Budget.member

    def watched(self, name, declared, compressed):
        add = member(self, name, declared, compressed)

        def counting(n, written):
            peak[0] = max(peak[0], written)
            add(n, written)
        return counting

    monkeypatch.setattr(ex._Budget, "member", watched)
    out = tmp_path / "out"
    with pytest.raises(UnsafeArchiveError, match=r"zeros\.bin.*while writing"):
        ex.extract(bomb, out)
    assert 0 < peak[0] < 256 * MiB
    assert _left_behind(out) == []
    # the per-member and total caps count while writing too
    with pytest.raises(UnsafeArchiveError, match="over the cap of 4194304 bytes while writing"):
        ex.extract(bomb, out, limits=ExtractLimits(max_member_bytes=4 * MiB, max_ratio=1e9))
    with pytest.raises(UnsafeArchiveError, match="total cap of 8388608 bytes while writing"):
        ex.extract(bomb, out, limits=ExtractLimits(max_total_bytes=8 * MiB, max_ratio=1e9))
    assert _left_behind(out) == []


def test_member_and_total_caps_from_the_headers(tmp_path):
    p = _zip(tmp_path / "big.zip", [("a/one.bin", bytes(3 * MiB)), ("a/two.bin", bytes(3 * MiB))], zipfile.ZIP_STORED)
    with pytest.raises(UnsafeArchiveError, match=r"'a/one\.bin' is 3145728 bytes uncompressed, over the cap"):
        ex.check_archive(p, limits=ExtractLimits(max_member_bytes=2 * MiB))
    with pytest.raises(UnsafeArchiveError, match=r"the archive holds over 5242880 bytes uncompressed in total"):
        ex.check_archive(p, limits=ExtractLimits(max_total_bytes=5 * MiB))
    assert ex.check_archive(p) == ["a/one.bin", "a/two.bin"]  # the defaults hold ordinary archives
    # text that compresses well (JSON annotations) stays under the default ratio
    rng = random.Random(0)
    words = "a man woman dog cat riding sitting on the of with bike road table red blue small large".split()
    text = json.dumps({f"COCO_val2014_{i:012d}.jpg": [" ".join(rng.choices(words, k=10)) for _ in range(5)]
                       for i in range(8000)}).encode()
    q = _zip(tmp_path / "ann.zip", [("annotations/coco/test_captions.json", text)])
    assert len(text) > ex.ExtractLimits().ratio_floor_bytes
    tmp, hashes = ex.extract(q, tmp_path / "ok")
    assert hashes["annotations/coco/test_captions.json"][1] == len(text)


def test_a_tar_gz_bomb_is_refused_at_its_headers(tmp_path):
    p = tmp_path / "bomb.tar.gz"
    p.write_bytes(_tar_bytes({"pkg/ok.txt": b"ok", "pkg/zeros.bin": bytes(8 * MiB)}, "w:gz"))
    assert p.stat().st_size < 64 * 1024
    with pytest.raises(UnsafeArchiveError, match=r"compressed tar \(ratio over 200: a bomb\?\)") as e:
        ex.extract(p, tmp_path / "out")
    assert "\n" not in str(e.value)
    assert _left_behind(tmp_path / "out") == []
    # an ordinary tar.gz of the same names passes
    q = tmp_path / "ok.tar.gz"
    q.write_bytes(_tar_bytes({"pkg/ok.txt": b"ok", "pkg/data.bin": random.Random(1).randbytes(2 * MiB)}, "w:gz"))
    tmp, hashes = ex.extract(q, tmp_path / "out")
    assert hashes["pkg/data.bin"][1] == 2 * MiB


def test_duplicate_names_are_refused_whole(tmp_path):
    p = _zip(tmp_path / "dup.zip", [("wordnet/lexnames", b"genuine"), ("wordnet/other", b"x"),
                                    ("wordnet/lexnames", b"the last copy would win")])
    with pytest.raises(UnsafeArchiveError, match=r"'wordnet/lexnames' is a name that appears twice"):
        ex.extract(p, tmp_path / "out")
    assert _left_behind(tmp_path / "out") == []
    nfc, nfd = unicodedata.normalize("NFC", "wordnet/café"), unicodedata.normalize("NFD", "wordnet/café")
    assert nfc != nfd
    q = _zip(tmp_path / "nfd.zip", [(nfc, b"a"), (nfd, b"b")])
    with pytest.raises(UnsafeArchiveError, match="appears twice"):
        ex.check_archive(q)
    r = _zip(tmp_path / "dot.zip", [("wordnet/x", b"a"), ("./wordnet/x", b"b")])
    with pytest.raises(UnsafeArchiveError, match="appears twice"):
        ex.check_archive(r)
    t = tmp_path / "dup.tar"
    with tarfile.open(t, "w") as tf:
        for body in (b"one", b"two"):
            ti = tarfile.TarInfo("pkg/file")
            ti.size = len(body)
            tf.addfile(ti, io.BytesIO(body))
    with pytest.raises(UnsafeArchiveError, match="appears twice"):
        ex.check_archive(t)


def test_names_that_differ_only_by_case_are_refused_as_duplicates(tmp_path):
    """``README`` and ``readme`` are one file on macOS and Windows: the later one would overwrite it."""
    p = _zip(tmp_path / "case.zip", [("pkg/README", b"genuine"), ("pkg/other", b"x"), ("pkg/readme", b"evil")])
    with pytest.raises(UnsafeArchiveError, match=r"'pkg/readme' is a name that appears twice .*as 'pkg/README'"):
        ex.extract(p, tmp_path / "out")
    assert _left_behind(tmp_path / "out") == []
    # a file against a folder of the same name but another case, and a whole folder in another case
    for entries in ([("pkg/Data", b"a"), ("pkg/data/x", b"b")], [("pkg/data/x", b"b"), ("pkg/Data", b"a")],
                    [("Pkg/x", b"a"), ("pkg/x", b"b")]):
        with pytest.raises(UnsafeArchiveError, match="appears twice|a path through 'pkg/Data', which is a file"):
            ex.check_archive(_zip(tmp_path / "c.zip", entries))
    t = tmp_path / "case.tar"
    with tarfile.open(t, "w") as tf:
        for name in ("pkg/Lexnames", "pkg/LEXNAMES"):
            ti = tarfile.TarInfo(name)
            ti.size = 3
            tf.addfile(ti, io.BytesIO(b"abc"))
    with pytest.raises(UnsafeArchiveError, match="appears twice"):
        ex.check_archive(t)
    # the same folder listed in two cases is one folder, and distinct names still pass
    ok = _zip(tmp_path / "ok.zip", [("pkg/", b""), ("PKG/", b""), ("pkg/a", b"1"), ("pkg/b", b"2")])
    assert len(ex.check_archive(ok)) == 4


def test_a_nul_in_the_raw_member_name_is_refused(tmp_path):
    """zipfile cuts ``filename`` at a NUL (``evil.txt``); ``orig_filename`` keeps what the archive says."""
    placeholder = "evil.txt#../../x"
    raw = bytearray((_zip(tmp_path / "n.zip", [("wordnet/lexnames", b"ok"), (placeholder, b"boom")])).read_bytes())
    raw = raw.replace(placeholder.encode(), b"evil.txt\x00../../x")
    p = tmp_path / "nul.zip"
    p.write_bytes(bytes(raw))
    with zipfile.ZipFile(p) as z:
        assert "evil.txt" in z.namelist()  # what the old check looked at
    with pytest.raises(UnsafeArchiveError, match=r"NUL byte") as e:
        ex.extract(p, tmp_path / "out")
    assert "\n" not in str(e.value)
    assert _left_behind(tmp_path / "out") == []
    assert not (tmp_path / "out" / "evil.txt").exists()


def _tar_bytes(entries: dict[str, bytes], mode: str = "w") -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode) as t:
        for name, body in entries.items():
            ti = tarfile.TarInfo(name)
            ti.size = len(body)
            t.addfile(ti, io.BytesIO(body))
    return buf.getvalue()


@pytest.mark.parametrize("kind", ["truncated-tar", "size-lying-tar", "truncated-tar.gz", "truncated-zip"])
def test_damaged_archives_are_one_line_errors_with_nothing_left(tmp_path, kind):
    body = bytes(range(256)) * 64  # 16 KiB
    if kind == "truncated-tar":
        raw = _tar_bytes({"pkg/a.bin": body, "pkg/b.bin": body})
        raw = raw[: 512 + 8000]  # the first member's header and half its data
    elif kind == "size-lying-tar":
        raw = bytearray(_tar_bytes({"pkg/a.bin": body}))
        ti = tarfile.TarInfo("pkg/a.bin")
        ti.size = 10 * len(body)  # says ten times what follows it
        raw[:512] = ti.tobuf(format=tarfile.DEFAULT_FORMAT)
        raw = bytes(raw[: 512 + len(body)])
    elif kind == "truncated-tar.gz":
        raw = _tar_bytes({"pkg/a.bin": bytes(range(256)) * 4096}, "w:gz")
        raw = raw[: len(raw) // 2]
    else:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
            z.writestr("pkg/a.bin", body)
        raw = buf.getvalue()
        raw = raw[:200] + raw[-120:]  # data cut out, directory kept
    p = tmp_path / f"damaged.{kind.split('-')[-1]}"
    p.write_bytes(raw)
    out = tmp_path / "out"
    with pytest.raises(PrepareError) as e:
        ex.extract(p, out)
    msg = str(e.value)
    assert "\n" not in msg and str(p) in msg and ("run again" in msg or "official source" in msg)
    assert not isinstance(e.value.__cause__, (EOFError, tarfile.ReadError))
    assert _left_behind(out) == []


def test_limits_come_from_the_sources_file(tmp_path):
    p = tmp_path / "s.toml"
    p.write_text("[limits]\nmax_ratio = 50\nstall_seconds = 5\n")
    deadlines, limits = limits_of(load_sources(p))
    assert limits.max_ratio == 50 and deadlines.stall_seconds == 5
    assert limits.max_member_bytes == 8 * GiB  # the packaged default
    p.write_text("[limits]\nmax_ratoi = 50\n")
    with pytest.raises(PrepareError, match=r"\[limits\]\.max_ratoi: unknown limit"):
        limits_of(load_sources(p))
    p.write_text('[limits]\nmax_ratio = "lots"\n')
    with pytest.raises(PrepareError, match=r"max_ratio: 'lots' is not a non-negative number"):
        limits_of(load_sources(p))

"""Hostile inputs without Ray: a folder of hostile files through the folder benchmark and the four
stages; hostile annotation files; hostile predictions for `adjcap evaluate`. Each asserts every image
exactly once, nothing lost, one-line messages, and that no code from the inputs ran."""

from __future__ import annotations

import json
import os
import pickle
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from adjcap.data.benchmarks import read_benchmark
from adjcap.data.image_paths import ESCAPES_ROOT
from adjcap.data.records import DataError
from adjcap.engine.pipeline import load_models, run_pipeline
from adjcap.cli import app

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


class Planted:
    """Unpickling this runs `open(marker, "w")`: proof of execution if the marker ever appears."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _png_header_only(path: Path, w: int, h: int) -> None:
    """A valid small PNG that claims w x h pixels (a decompression bomb: tiny file, huge image)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)
    idat = zlib.compress(b"\0" * 1024)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b""))


def hostile_folder(root: Path, outside: Path, markers: list[Path]) -> tuple[set[str], dict[str, str]]:
    """Write the folder; return (ids expected to decode, {id: expected error fragment})."""
    root.mkdir()
    rng = np.random.default_rng(0)
    good = Image.fromarray(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8))
    good.save(root / "good.jpg")
    ok = {"good.jpg"}
    bad: dict[str, str] = {}
    (root / "zero.jpg").write_bytes(b"")
    bad["zero.jpg"] = "empty file (0 bytes)"
    data = (root / "good.jpg").read_bytes()
    (root / "truncated.jpg").write_bytes(data[: len(data) // 2])
    bad["truncated.jpg"] = "truncated"
    (root / "text.jpg").write_text("this is not an image, it is text\n" * 20)
    bad["text.jpg"] = "not an image"
    (root / "pickled.jpg").write_bytes(pickle.dumps(Planted(str(markers[0]))))
    bad["pickled.jpg"] = "not an image"
    Image.new("RGB", (1, 1), (200, 10, 10)).save(root / "one.png")
    ok.add("one.png")
    _png_header_only(root / "bomb.png", 40_000, 40_000)
    bad["bomb.png"] = "too large"
    good.convert("CMYK").save(root / "cmyk.jpg")
    ok.add("cmyk.jpg")
    Image.fromarray((rng.integers(0, 65535, (30, 40))).astype(np.uint16)).save(root / "deep16.png")
    ok.add("deep16.png")
    exif = Image.Exif()
    exif[0x0112] = 6  # stored sideways: decoded upright as 48 wide, 64 high
    good.save(root / "rotated.jpg", exif=exif)
    ok.add("rotated.jpg")
    outside.write_text("root:x:0:0:secret\n")
    (root / "link-out.jpg").symlink_to(outside)
    bad["link-out.jpg"] = ESCAPES_ROOT
    (root / "dangling.jpg").symlink_to("nowhere.jpg")
    bad["dangling.jpg"] = "file not found"
    (root / "dangling-out.jpg").symlink_to("/nonexistent-adjcap/x.jpg")
    bad["dangling-out.jpg"] = ESCAPES_ROOT
    os.mkfifo(root / "fifo.jpg")
    bad["fifo.jpg"] = "a FIFO"
    (root / "dir.jpg").mkdir()  # a directory with an image name is walked into, not a record
    for name in (f"$(touch {markers[1].name}).jpg", f"`touch {markers[1].name}`.png",
                 "sp ace;rm -rf x.jpg", "ünïcode 名前.jpg", "-rf.jpg", "new\nline.jpg"):
        good.save(root / name, format="PNG" if name.endswith(".png") else "JPEG")
        ok.add(name)
    (root / "sub").mkdir()
    good.save(root / "sub" / "nested.jpg")
    ok.add("sub/nested.jpg")
    good.save(root / ".hidden.jpg")  # hidden files are skipped, by design
    return ok, bad


@pytest.fixture(scope="module")
def models(demo_cfg):
    cfg = demo_cfg.resolved()
    return cfg, load_models(cfg)


def test_a_folder_of_hostile_files_gives_one_row_each_and_runs_nothing(tmp_path, models, monkeypatch):
    cfg, m = models
    monkeypatch.chdir(tmp_path)  # a `touch` that ran would leave its file here
    markers = [tmp_path / "PWNED-pickle", tmp_path / "PWNED-shell"]
    ok, bad = hostile_folder(tmp_path / "mine", tmp_path / "secret.txt", markers)
    records = read_benchmark("folder", tmp_path / "mine", None, "test")
    ids = [r.image_id for r in records]
    assert len(ids) == len(set(ids)) and set(ids) == ok | set(bad)  # every file once, the hidden one not
    rows = run_pipeline(records, cfg, models=m, benchmark="mine")
    assert [r["image_id"] for r in rows] == ids  # one row per image, in order, none lost
    by_id = {r["image_id"]: r for r in rows}
    for i in ok:
        assert by_id[i]["error"] is None, (i, by_id[i]["error"])
        assert len(by_id[i]["candidates"]) > 0
    for i, fragment in bad.items():
        err = by_id[i]["error"]
        assert err and fragment in err and "\n" not in err.replace(i, ""), (i, err)
        assert by_id[i]["candidates"] == []
    assert "root:x:0:0" not in json.dumps(rows)  # the file outside the root was never read
    assert not any(p.exists() for p in markers) and not list(tmp_path.glob("*PWNED*"))
    rot = next(r for r in records if r.image_id == "rotated.jpg")
    from adjcap.engine.image_state import decode_state

    assert decode_state("r", "mine", "test", None, rot.image_path).pil().size == (48, 64)


def _karpathy(path: Path, images: list) -> Path:
    path.write_text(json.dumps({"images": images}))
    return path


def test_annotations_cannot_reach_outside_the_image_root(tmp_path):
    root = tmp_path / "images"
    root.mkdir()
    Image.new("RGB", (8, 8)).save(root / "a.jpg")
    (tmp_path / "secret.jpg").write_bytes(b"secret")
    sent = [{"raw": "a photo"}]
    ann = _karpathy(tmp_path / "k.json", [
        {"filename": "a.jpg", "split": "test", "sentences": sent},
        {"filename": "../secret.jpg", "split": "test", "sentences": sent},
        {"filename": "/etc/passwd", "split": "test", "sentences": sent},
        {"filepath": "../..", "filename": "etc/hostname", "split": "test", "sentences": sent},
    ])
    recs = read_benchmark("karpathy", ann, root, "test")
    assert len(recs) == 4 and len({r.image_id for r in recs}) == 4
    assert recs[0].error is None and recs[0].image_path
    for r in recs[1:]:
        assert r.image_path is None and ESCAPES_ROOT in r.error and "\n" not in r.error, r


@pytest.mark.parametrize("images", [
    {"not": "a list"},
    [{"filename": 123, "split": "test", "sentences": [{"raw": "x"}]}],
    [{"filename": "a.jpg", "split": "test", "sentences": "not a list"}],
    [{"split": "test", "sentences": [{"raw": "x"}]}],
    ["a string, not an image entry"],
])
def test_wrong_types_in_annotations_are_one_line_errors_before_any_work(tmp_path, images, demo_cfg):
    root = tmp_path / "images"
    root.mkdir()
    Image.new("RGB", (8, 8)).save(root / "a.jpg")
    ann = _karpathy(tmp_path / "k.json", images)
    with pytest.raises(DataError) as e:
        read_benchmark("karpathy", ann, root, "test")
    assert "\n" not in str(e.value) and str(ann) in str(e.value)
    run_dir = tmp_path / "run"
    res = CliRunner().invoke(app, [
        "run-job", "bad", "--preset", "demo", "--run-dir", str(run_dir),
        "--set", f"paths.cache_dir={demo_cfg.paths.cache_dir}", "--set", "benchmarks.bad.format=karpathy",
        "--set", f"benchmarks.bad.annotations={ann}", "--set", f"benchmarks.bad.images={root}",
        "--set", "splits=['test']", "--set", "rerank.protocol=transductive", "--set", "rerank.fit_split=test",
    ])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and str(ann) in lines[0], res.output
    assert not run_dir.exists()  # refused before anything was written


def _evaluate(*args):
    return CliRunner().invoke(app, ["evaluate", "--no-spice", *map(str, args)])


def test_predictions_with_unknown_ids_are_refused_in_one_line_unless_intersection(tmp_path, small_coco):
    pred, refs, _ = small_coco
    rows = json.loads(pred.read_text())
    rows.append({"image_id": 987654321, "caption": "a picture of something"})
    pred.write_text(json.dumps(rows))
    res = _evaluate("--predictions", pred, "--references", refs, "--out", tmp_path / "m.json")
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and "--intersection" in lines[0], res.output
    assert not (tmp_path / "m.json").exists()
    res = _evaluate("--predictions", pred, "--references", refs, "--out", tmp_path / "m.json", "--intersection")
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "m.json").read_text())
    assert doc["n_images"] == len(rows) - 1


@pytest.mark.parametrize("bad", [
    {"not": "a list"},
    [{"image_id": 1, "caption": 123}],
    [{"image_id": None, "caption": "a dog"}],
    ["just a string"],
])
def test_predictions_of_the_wrong_shape_are_one_line_errors(tmp_path, small_coco, bad):
    _, refs, _ = small_coco
    pred = tmp_path / "bad.json"
    pred.write_text(json.dumps(bad))
    res = _evaluate("--predictions", pred, "--references", refs)
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:"), res.output
    assert "Traceback" not in res.output


def test_a_huge_caption_is_scored_with_the_others(tmp_path, small_coco):
    pred, refs, caps = small_coco
    rows = json.loads(pred.read_text())
    rows[0]["caption"] = "a dog on the grass " * 15_000  # 285,000 characters
    pred.write_text(json.dumps(rows))
    res = _evaluate("--predictions", pred, "--references", refs, "--out", tmp_path / "m.json")
    assert res.exit_code == 0, res.output
    doc = json.loads((tmp_path / "m.json").read_text())
    assert doc["n_images"] == len(rows) and all(doc["metrics"][k] is not None for k in ("B-4", "METEOR", "CIDEr"))

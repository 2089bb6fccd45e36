"""The models' pixel geometries remembered (adjcap.engine.pixel_memo): the same answer as the model's own
preprocessing, found again on disk without its library, and found out again when its file changes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from adjcap.engine import pixel_memo
from adjcap.engine.pixel_prep import PixelPrep

ROOT = Path(__file__).resolve().parents[1]


def test_the_remembered_geometry_is_the_model_s_and_keyed_by_its_file(demo_cfg, tmp_path, monkeypatch):
    from adjcap.models.clip import pixel_prep_for
    from adjcap.models.roles import verifier_pixel_prep

    cfg = demo_cfg.resolved()
    enc = cfg.retrieval.encoder
    monkeypatch.setattr(pixel_memo, "_MEMO", {})
    assert pixel_memo.clip_pixels(enc, tmp_path) == pixel_prep_for(enc) is not None
    assert pixel_memo.verifier_pixels(cfg.verifier, tmp_path) == verifier_pixel_prep(cfg.verifier) is not None
    stored = {p.name: json.loads(p.read_text()) for p in (tmp_path / "pixels").glob("*.json")}
    assert len(stored) == 2

    # read back from disk (not computed): a planted answer under the key is what a new process gets
    key = pixel_memo.memo_key("open_clip", enc.model_dump())
    planted = PixelPrep(7, 9, "squash")
    (tmp_path / "pixels" / f"{key}.json").write_text(json.dumps(pixel_memo.asdict(planted)))
    monkeypatch.setattr(pixel_memo, "_MEMO", {})
    assert pixel_memo.clip_pixels(enc, tmp_path) == planted
    # a file that is not this format is found out again and written over
    (tmp_path / "pixels" / f"{key}.json").write_text("{not json")
    monkeypatch.setattr(pixel_memo, "_MEMO", {})
    assert pixel_memo.clip_pixels(enc, tmp_path) == pixel_prep_for(enc)
    assert json.loads((tmp_path / "pixels" / f"{key}.json").read_text()) == stored[f"{key}.json"]

    # nothing stale: another checkpoint file, or the same path with other bytes, is another key
    copy = tmp_path / "ckpt" / Path(enc.pretrained).name
    copy.parent.mkdir()
    shutil.copyfile(enc.pretrained, copy)
    moved = enc.model_copy(update={"pretrained": str(copy)})
    assert pixel_memo.memo_key("open_clip", moved.model_dump()) != key
    before = pixel_memo.memo_key("open_clip", moved.model_dump())
    with open(copy, "ab") as f:
        f.write(b"\0")
    os.utime(copy, (1, 1))
    assert pixel_memo.memo_key("open_clip", moved.model_dump()) != before


def test_a_warm_driver_plans_its_pixels_without_torch(demo_cfg, tmp_path):
    """The run plan finds the decode step's geometries out; the second process reads them from the cache
    with neither open_clip nor torch imported (``import open_clip`` alone is ~9 s of CPU on a slow box)."""
    code = (
        "import sys; from adjcap.config import load_config; from adjcap.engine import stage_registry as r;"
        f"cfg = load_config('demo', ['paths.cache_dir={demo_cfg.paths.cache_dir}',"
        f" 'paths.runs_dir={tmp_path}']).resolved();"
        "preps, known = r.pixel_preps(cfg, r.names()); print(len(preps), known, 'open_clip' in sys.modules,"
        " 'torch' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    runs = [subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=300) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), [r.stderr[-2000:] for r in runs]
    first, second = (r.stdout.split() for r in runs)
    assert first[:2] == second[:2] and int(first[0]) >= 1 and first[1] == "True"
    assert second[2:] == ["False", "False"], second

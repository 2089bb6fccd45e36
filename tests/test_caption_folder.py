"""`adjcap caption DIR --preset demo`: the Ray job over a folder of real COCO images (tests/fixtures),
training-free picker, captions.jsonl + HTML gallery, EXIF orientation honoured. The command is the
console script of the wheel built from the repository's tracked files and installed into a new venv
(tests/wheel_venv.py), run outside the checkout: the installed layout captions through Ray."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image

from adjcap.config import load_config
from adjcap.storage.rundir import RunDir
from wheel_venv import build_wheel, new_venv, tracked_copy

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).parent / "fixtures" / "data" / "images"
EXIF_ORIENTATION = 0x0112


@pytest.fixture(scope="module")
def captioned(demo_cfg, tmp_path_factory):
    whl, _ = build_wheel(tracked_copy(tmp_path_factory.mktemp("src")), tmp_path_factory.mktemp("wheel"))
    bin_dir = new_venv(tmp_path_factory.mktemp("venv") / "v", whl)
    folder = tmp_path_factory.mktemp("photos")
    for p in sorted(FIXTURES.glob("*.jpg")):
        shutil.copy(p, folder / p.name)
    # the same photo twice as PNG: upright, and stored sideways with the EXIF tag that turns it upright
    with Image.open(sorted(FIXTURES.glob("*.jpg"))[0]) as im:
        im = im.convert("RGB")
        (folder / "phone").mkdir()
        im.save(folder / "phone" / "upright.png")
        exif = Image.Exif()
        exif[EXIF_ORIENTATION] = 6  # "rotate 90 degrees clockwise to display"
        im.rotate(90, expand=True).save(folder / "phone" / "sideways.png", exif=exif)
    run_dir = tmp_path_factory.mktemp("run") / "cap"
    out = tmp_path_factory.mktemp("out") / "mine.jsonl"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([
        str(bin_dir / "adjcap"), "caption", str(folder), "--preset", "demo", "--out", str(out), "--run-dir",
        str(run_dir), "--set", f"paths.cache_dir={demo_cfg.paths.cache_dir}", "--set", "ray.include_dashboard=false",
    ], cwd=out.parent, env=env, capture_output=True, text=True, timeout=900)
    output = res.stdout + res.stderr
    assert res.returncode == 0, output[-4000:]
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    return {"folder": folder, "run_dir": run_dir, "out": out, "lines": lines, "output": output, "bin": bin_dir}


def test_the_installed_wheel_ran_it(captioned):
    """The job's code came from the new venv's site-packages, where no generic name is installed."""
    py = captioned["bin"] / "python"
    code = ("import importlib.util as u, adjcap.jobs.caption as c; print(c.__file__); "
            "print([n for n in ('jobs', 'actors', 'cli') if u.find_spec(n)])")
    res = subprocess.run([str(py), "-c", code], cwd=captioned["out"].parent, capture_output=True, text=True)
    where, generic = res.stdout.split("\n")[:2]
    assert where.startswith(str(captioned["bin"].parent)) and "site-packages" in where, res.stdout + res.stderr
    assert generic == "[]"


def test_one_line_per_image_with_candidates_and_their_scores(captioned):
    lines = captioned["lines"]
    assert [x["image_id"] for x in lines] == sorted(
        ["COCO_val2014_000000354533.jpg", "COCO_val2014_000000579664.jpg", "phone/sideways.png", "phone/upright.png"])
    cfg = load_config("demo")
    for x in lines:
        assert x["error"] is None and x["image"] == x["image_id"]  # relative to the captioned folder
        assert (captioned["folder"] / x["image"]).is_file()
        assert x["picker"] == "fixed"  # the demo preset's learned picker needs heads: training-free instead
        cands = x["candidates"]
        assert len(cands) == cfg.captioner.beam_width and sum(c["chosen"] for c in cands) == 1
        chosen = next(c for c in cands if c["chosen"])
        assert x["caption"] == chosen["text"] and x["caption"].strip()
        assert x["lm_caption"] == next(c for c in cands if c["beam_rank"] == 0)["text"]
        for c in cands:
            assert -1.0 <= c["retrieval_cosine"] <= 1.0 and 0.0 < c["verifier"] < 1.0 and c["lm_logprob_mean"] < 0


def test_the_fixed_fusion_chose_each_caption(captioned):
    """alpha z(LM) + (1 - alpha) z(retrieval cosine), the paper's fixed fusion, recomputed from the line."""
    import numpy as np

    alpha = load_config("demo").rerank.alpha
    for x in captioned["lines"]:
        lm = np.array([c["lm_logprob_mean"] for c in x["candidates"]])
        cos = np.array([c["retrieval_cosine"] for c in x["candidates"]])

        def z(v):
            return (v - v.mean()) / (v.std() + 1e-8) if v.std() > 0 else v * 0

        best = int(np.argmax(alpha * z(lm) + (1 - alpha) * z(cos)))
        assert x["candidates"][best]["chosen"], x["image_id"]


def test_exif_orientation_is_honoured(captioned):
    by = {x["image_id"]: x for x in captioned["lines"]}
    up, side = by["phone/upright.png"], by["phone/sideways.png"]
    assert side["caption"] == up["caption"]
    assert [c["retrieval_cosine"] for c in side["candidates"]] == pytest.approx(
        [c["retrieval_cosine"] for c in up["candidates"]], abs=1e-5)


def test_the_demo_preset_warns_that_these_are_not_demo_world_images(captioned):
    assert "warning: --preset demo captions with tiny models trained only on the synthetic demo world; " \
           "4 of 4 images" in captioned["output"]


def test_gallery_and_run_directory(captioned):
    html = captioned["out"].with_suffix(".html").read_text()
    assert html.count("data:image/jpeg;base64,") == 4
    for x in captioned["lines"]:
        assert x["caption"].replace("'", "&#x27;") in html
    rd = RunDir(captioned["run_dir"])
    preds = rd.predictions("training-free", "fixed")
    assert {p["image_id"]: p["caption"] for p in preds} == {x["image_id"]: x["caption"] for x in captioned["lines"]}
    assert rd.config_path.is_file() and "folder" in rd.config_path.read_text()

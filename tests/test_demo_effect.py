"""The demo world shows the paper's effect, and for the paper's reason. Stage by stage, so a change that
breaks the effect names the stage that got worse:

1. the judges are good at this world (held-out retrieval recall, ITM accuracy), better than the
   captioner's own CLIP;
2. the text-only captioner makes the paper's errors (colours, objects, counts its scene contradicts);
3. adjudication (the demo's headline: heads fitted on the val split's Borda pseudo-labels only, never
   on references, applied to test) beats the LM-only pick on CIDEr, with a paired bootstrap interval
   over the 300 test images that excludes zero, and lowers CHAIR_i (asserted: the direction; its
   interval is narrow on this world: BENCHMARKS.md).

Everything runs on the fixed demo world built once per session (``demo_cfg``); the headline is ``adjcap
demo`` itself, on Ray, with portable numerics, and its predictions must be the committed ones.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from console_checks import assert_quiet_console

from adjcap.machine import numerics
from adjcap.demo import figures
from adjcap.demo.quality import caption_errors, judge_quality
from adjcap.metrics.bootstrap import paired_bootstrap, ratio_percent
from adjcap.metrics.evaluate import Evaluator
from adjcap.engine.run_plan import read_records

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def quality(demo_cfg):
    return judge_quality(Path(demo_cfg.resolved().paths.cache_dir) / "tiny", demo_cfg.seed)


@pytest.fixture(scope="module")
def demo_run(demo_cfg, tmp_path_factory):
    """``adjcap demo`` as users run it (the command line, so portable numerics; Ray; val and test through
    the four stages, the heads fitted on the val beams' Borda consensus, every picker applied to test),
    on the session's demo world. Its run directory."""
    run_dir = tmp_path_factory.mktemp("demo-run") / "demo"
    cmd = [sys.executable, "-m", "adjcap", "demo", "--run-dir", str(run_dir),
           "--set", f"paths.cache_dir={demo_cfg.paths.cache_dir}", "--set", "ray.include_dashboard=false"]
    res = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=1200)
    assert res.returncode == 0, res.stdout[-4000:]
    (run_dir.parent / "console.txt").write_text(res.stdout)  # what the user saw, stdout and stderr together
    return run_dir


@pytest.fixture(scope="module")
def effect(demo_cfg, demo_run):
    """The demo's headline run: the configured ensemble picker and the LM-only pick on test, both scored
    against the test references here, apart from the run's own evaluation."""
    cfg = demo_cfg.resolved()
    assert cfg.rerank.protocol == "inductive" and cfg.rerank.fit_split == "val"
    records = read_records(cfg)
    preds = demo_run / "predictions" / "inductive"
    captions = {name: {r["image_id"]: r["caption"] for r in json.loads((preds / f"{picker}.json").read_text())}
                for name, picker in (("lm", "lm"), ("adjudicated", cfg.rerank.picker))}
    refs = {r.image_id: list(r.references) for r in records["test"]}
    with Evaluator(refs) as ev:
        scores = {name: ev.score(c) for name, c in captions.items()}
    scenes = json.loads((Path(cfg.paths.cache_dir) / "demo" / "manifest.json").read_text())["scenes"]
    return {"captions": captions, "scores": scores, "scenes": scenes, "n": len(records["test"])}


@pytest.mark.slow
def test_demo_run_gives_the_committed_figures(demo_run):
    """Portable numerics: the predictions and the headline of ``make demo`` are the ones every x86-64 CPU
    with AVX2 gives (adjcap/demo/expected.json, written by benchmarks/demo_figures.py); a machine that
    computes something else fails here instead of printing other numbers."""
    if numerics.cpu_problem():  # a CPU the committed bits do not hold on (it says why): nothing to compare
        pytest.skip(numerics.cpu_problem())
    want = figures.expected()
    assert figures.prediction_digests(demo_run) == want["predictions"]
    assert figures.headline(demo_run) == want["headline"]


@pytest.mark.slow
def test_the_demo_console_is_adjcaps_own(demo_cfg, demo_run):
    """The quiet default console on ``adjcap demo``: adjcap's progress and summary, nothing of Ray's
    (no INFO lines, no issue-detector memory warnings), no open_clip "initialized randomly"; the
    summary lists exactly what the run wrote, the run directory comes last."""
    images = sum(len(r) for r in read_records(demo_cfg.resolved()).values())
    out = (demo_run.parent / "console.txt").read_text()
    listed = assert_quiet_console(out, demo_run, images)
    assert {"metrics/", "report.md", "report.html", "predictions/"} <= set(listed)


# ---- stage 1: the judges ---------------------------------------------------------------------------


def test_stage1_retrieval_judge_recalls_held_out_pairs(quality):
    ret, cap = quality["retrieval_clip"], quality["captioner_clip"]
    assert ret["i2t_r@1"] >= 0.18 and ret["i2t_r@5"] >= 0.45, ret  # chance: 0.005 / 0.025 of 200
    assert ret["i2t_r@5"] > cap["i2t_r@5"], (ret, cap)  # the judge sees the image better than the captioner


@pytest.mark.xfail(numerics.cpu_problem() is not None, strict=False,
                   reason="thresholds of the committed tiny world; this CPU builds another (numerics.cpu_problem)")
def test_stage1_verifier_judges_held_out_pairs(quality):
    itm = quality["blip_itm"]
    assert itm["accuracy"] >= 0.65, itm  # chance 0.5; the pairs are mostly one-word negatives
    assert itm["pairwise_swap"] >= 0.65 and itm["pairwise_count"] >= 0.75 and itm["pairwise_other"] >= 0.85, itm
    assert itm["pairwise_insert"] >= 0.9, itm  # an absent object added to a true caption


# ---- stage 2: the captioner's errors ---------------------------------------------------------------


def _error_rate(captions, scenes):
    return float(np.mean([bool(caption_errors(c, scenes[i])) for i, c in captions.items()]))


@pytest.mark.slow
def test_stage2_text_only_captioner_makes_the_papers_errors(effect):
    lm = _error_rate(effect["captions"]["lm"], effect["scenes"])
    assert lm >= 0.3, f"LM-only captions contradicting their scene: {lm:.2f}"


# ---- stage 3: the effect ---------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.xfail(numerics.cpu_problem() is not None, strict=False,
                   reason="a property of the committed tiny world; this CPU builds another (numerics.cpu_problem)")
def test_stage3_adjudication_makes_fewer_errors(effect):
    lm = _error_rate(effect["captions"]["lm"], effect["scenes"])
    adj = _error_rate(effect["captions"]["adjudicated"], effect["scenes"])
    assert adj < lm, (lm, adj)


@pytest.mark.slow
def test_stage3_adjudication_beats_lm_only_on_cider(effect):
    assert effect["n"] >= 300
    a, b = effect["scores"]["lm"]["per_image"], effect["scores"]["adjudicated"]["per_image"]
    ids = sorted(a)
    d = paired_bootstrap([[a[i]["CIDEr"]] for i in ids], [[b[i]["CIDEr"]] for i in ids])
    assert abs(d.delta - (effect["scores"]["adjudicated"]["metrics"]["CIDEr"]
                          - effect["scores"]["lm"]["metrics"]["CIDEr"])) < 1e-6
    assert d.low > 0, f"CIDEr {d.a:.1f} -> {d.b:.1f}, 95% CI [{d.low:+.1f}, {d.high:+.1f}]"


@pytest.mark.slow
def test_stage3_adjudication_hallucinates_less(effect):
    a, b = effect["scores"]["lm"]["per_image"], effect["scores"]["adjudicated"]["per_image"]
    keys = ("CHAIR_mentioned", "CHAIR_hallucinated")
    ids = sorted(a)
    d = paired_bootstrap([[a[i][k] for k in keys] for i in ids], [[b[i][k] for k in keys] for i in ids], ratio_percent)
    assert abs(d.a - effect["scores"]["lm"]["chair"]["CHAIR_i"]) < 1e-6
    assert d.delta < 0, f"CHAIR_i {d.a:.1f} -> {d.b:.1f}, 95% CI [{d.low:+.1f}, {d.high:+.1f}]"

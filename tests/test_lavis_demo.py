"""`adjcap run-job demo --set verifier.backend=lavis` end to end on CPU: the demo's tiny LAVIS BlipITM
(LAVIS's classes, built in the isolated LAVIS environment) verifies and scores through the LAVIS pools;
the same run on the transformers backend, on that .pth converted at load time, gives the same verifier
scores and the same picks.

The LAVIS environment is built on first use under ``$ADJCAP_CACHE`` (as in test_lavis_backend.py) and
reached from the demo cache through a link, so the suite builds it once."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import tomllib

from adjcap.models import lavis_env
from adjcap.storage.rundir import RunDir

pytestmark = [pytest.mark.slow, pytest.mark.lavis]

LIMIT = 4


def _cache() -> Path:
    return Path(os.environ.get("ADJCAP_CACHE", "~/.cache/adjcap")).expanduser()


def _run_job(cache: Path, run_dir: Path, *sets: str) -> str:
    from typer.testing import CliRunner

    from adjcap.cli import app

    args = ["run-job", "demo", "--run-dir", str(run_dir), "--limit", str(LIMIT), "--set", f"paths.cache_dir={cache}",
            "--set", "ray.include_dashboard=false", "--set", "ray.rows_per_part=2",
            "--set", "cache.share_stages=false"]
    for s in sets:
        args += ["--set", s]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    return res.output


@pytest.fixture(scope="module")
def runs(demo_cfg, tmp_path_factory, one_local_ray):  # both jobs on one local Ray
    cache = Path(demo_cfg.paths.cache_dir)
    shared = lavis_env.build(_cache()).parent  # reused when present
    envs = cache / "envs"
    if not envs.exists() and shared != envs:
        envs.symlink_to(shared, target_is_directory=True)
    lavis = tmp_path_factory.mktemp("lavis") / "demo"
    out = _run_job(cache, lavis, "verifier.backend=lavis")
    pth = cache / "tiny" / "blip-itm-lavis" / "model_tiny_retrieval.pth"
    tok = pth.parent / "bert-tokenizer"
    hf = tmp_path_factory.mktemp("hf") / "demo"
    _run_job(cache, hf, f"verifier.model={pth}", f"verifier.tokenizer={tok}")
    return lavis, hf, pth, out


def test_the_lavis_run_used_the_tiny_lavis_judge(runs):
    lavis, _, pth, out = runs
    saved = tomllib.loads((lavis / "config.toml").read_text())["verifier"]
    assert saved["backend"] == "lavis" and Path(saved["model"]) == pth  # the saved config re-runs as is
    assert "tiny LAVIS BlipITM" in out
    assert (lavis / "report.md").is_file()


def test_both_backends_give_the_same_scores_and_picks(runs):
    lavis, hf, _, _ = runs
    a_rd, b_rd = RunDir(lavis), RunDir(hf)
    spread = []
    for split in ("val", "test"):
        a = {r["image_id"]: r for r in a_rd.read_features("demo", split).to_pylist()}
        b = {r["image_id"]: r for r in b_rd.read_features("demo", split).to_pylist()}
        assert set(a) == set(b) and len(a) == LIMIT
        for iid, ra in a.items():
            rb = b[iid]
            assert ra["error"] is None and rb["error"] is None, (ra["error"], rb["error"])
            assert ra["verifier_backend"] == "lavis" and rb["verifier_backend"] == "transformers"
            assert [r["text"] for r in ra["retrieved"]] == [r["text"] for r in rb["retrieved"]]
            va, vb = [r["verifier"] for r in ra["retrieved"]], [r["verifier"] for r in rb["retrieved"]]
            np.testing.assert_allclose(va, vb, atol=1e-5, rtol=0)
            spread += va
            assert [v["text"] for v in ra["verified"]] == [v["text"] for v in rb["verified"]]
            assert [c["text"] for c in ra["candidates"]] == [c["text"] for c in rb["candidates"]]
            np.testing.assert_allclose([c["verifier"] for c in ra["candidates"]],
                                       [c["verifier"] for c in rb["candidates"]], atol=1e-5, rtol=0)
            # the transformers scorer pool after the LAVIS one still adds the cosines
            for key in ("retrieval_cosine", "clipscore_cosine"):
                got = [c[key] for c in ra["candidates"]]
                assert np.isfinite(got).all(), (iid, key)
                np.testing.assert_allclose(got, [c[key] for c in rb["candidates"]], atol=1e-5, rtol=0)
    assert max(spread) - min(spread) > 1e-3  # the scores differ between captions: the comparison means something
    protocol = tomllib.loads((lavis / "config.toml").read_text())["rerank"]["protocol"]
    preds = sorted((lavis / "predictions" / protocol).glob("*.json"))
    assert {p.stem for p in preds} >= {"lm", "verifier", "ensemble", "trifuse", "memattend"}
    for p in preds:
        other = hf / "predictions" / protocol / p.name
        assert json.loads(p.read_text()) == json.loads(other.read_text()), p.stem

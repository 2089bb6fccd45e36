"""`--verbose` brings Ray's own output back, shown on `adjcap encode-corpus`, the smallest Ray job (every
command connects to Ray through the same session, jobs/ray_session.py). The quiet default (adjcap's
progress and summary, nothing of Ray's) is checked on the console of `adjcap demo` itself
(tests/test_demo_effect.py), the job every user runs first."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from console_checks import RAY_INFO

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def _cli(demo_cfg, *args: str) -> str:
    """An adjcap command on the session's demo world without the dashboard; the console it printed."""
    cmd = [sys.executable, str(ROOT / "cli.py"), *args, "--set", f"paths.cache_dir={demo_cfg.paths.cache_dir}",
           "--set", "ray.include_dashboard=false"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    res = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stdout
    return res.stdout


def test_ray_output_with_verbose(demo_cfg, tmp_path):
    # the demo corpus encoded into a new index: one Ray Data job with one actor
    # CPU tasks tokenise the shards beside the encoder pool (what a cluster with GPUs does by default)
    verbose = _cli(demo_cfg, "encode-corpus", "--preset", "demo", "--benchmark", "demo", "--verbose",
                   "--set", f"retrieval.index_dir={tmp_path / 'index'}", "--set", "ray.tokenize_tasks=true")
    assert RAY_INFO.search(verbose), verbose  # Ray's INFO lines (Ray Data's execution plan, progress) are back
    assert "Execution plan of Dataset" in verbose or "Running Dataset" in verbose, verbose
    # the tokenising tasks stay apart from the encoder pool (Ray Data fuses a task map into a following actor
    # map when their resources match, which would tokenise in the encoder's thread again)
    assert "MapBatches(tokenize_shard)" in verbose, verbose
    assert "MapBatches(tokenize_shard)->MapBatches(CorpusEncoderActor)" not in verbose, verbose
    # the CPU tasks tokenised, the encoder pool encoded: the index holds the corpus's captions as the
    # retrieval encoder encodes them in this process (Ray's workers run pinned numerics: last bits may differ)
    import numpy as np

    from adjcap.config import load_config
    from adjcap.index import benchmark_corpus, read_arrays
    from adjcap.models.roles import load_retrieval_encoder

    (manifest,) = (tmp_path / "index").rglob("manifest.json")
    vectors, ids, precision = read_arrays(manifest.parent)
    cfg = load_config("demo", [f"paths.cache_dir={demo_cfg.paths.cache_dir}"]).resolved()
    corpus = benchmark_corpus(cfg.benchmark_cfg(), "demo")
    here = load_retrieval_encoder(cfg.retrieval.encoder, "cpu", towers=("text",)).encode_texts(corpus.texts).numpy()
    assert precision == "fp32" and np.array_equal(ids, np.asarray(corpus.ids)), (precision, ids[:5])
    assert vectors.shape == here.shape and np.abs(vectors - here).max() < 1e-5, np.abs(vectors - here).max()

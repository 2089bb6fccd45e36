"""Reranker inputs read from feature tables: z-normalisation, masking, error rows, Parquet parts,
and the guarantee that the reranker cannot see reference captions."""

import ast
import inspect
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

import adjcap.rerank as rerank
from adjcap.engine.features import empty_row, rows_to_table
from adjcap.rerank import load_features, zscore
from adjcap.demo.synthetic import synthetic_feature_rows

ROOT = Path(__file__).resolve().parents[1]


def cand(text, lm_mean, cos, ver, rank, n_tok=5):
    return {
        "text": text,
        "lm_logprob_sum": lm_mean * n_tok,
        "lm_logprob_mean": lm_mean,
        "n_tokens": n_tok,
        "beam_rank": rank,
        "retrieval_cosine": cos,
        "verifier": ver,
    }


def row(iid, cands, verified=(), error=None):
    r = empty_row(iid, "coco", "val", None, error)
    r["candidates"] = list(cands)
    r["verified"] = list(verified)
    return r


def test_zscore_constant_column_is_zero_not_nan():
    x = torch.tensor([[[0.1, 1.0], [0.1, 2.0], [0.1, 3.0], [7.0, 9.0]]])
    mask = torch.tensor([[True, True, True, False]])
    z = zscore(x, mask)
    assert torch.isfinite(z).all()
    assert torch.equal(z[0, :, 0], torch.zeros(4))  # constant over the valid entries
    np.testing.assert_allclose(z[0, :3, 1].numpy(), [-1.2247449, 0.0, 1.2247449], rtol=1e-6)
    assert float(z[0, 3, 1]) == 0.0  # masked entry is 0 and left out of the statistics
    # NaN is treated as missing
    zn = zscore(torch.tensor([[1.0, float("nan"), 3.0]]), torch.ones(1, 3, dtype=torch.bool))
    np.testing.assert_allclose(zn[0].numpy(), [-1.0, 0.0, 1.0], rtol=1e-6)
    # a single valid entry
    assert torch.equal(zscore(torch.tensor([[5.0, 1.0]]), torch.tensor([[True, False]])), torch.zeros(1, 2))


def test_load_features_layout_and_values():
    rows = [
        row(
            "a",
            [cand("x y", -1.0, 0.3, 0.9, 1, 4), cand("p q r", -0.5, 0.1, 0.2, 0, 6), cand("s", -2.0, 0.2, 0.5, 2, 3)],
            [
                {"corpus_id": 1, "text": "one two three", "verifier": 0.8, "retrieval_rank": 2},
                {"corpus_id": 2, "text": "four five", "verifier": 0.4, "retrieval_rank": 0},
            ],
        ),
        row("bad", [], error="decode failed: broken.png"),
        row("b", [cand("only", -1.0, 0.3, 0.5, 0)]),
    ]
    f = load_features(rows_to_table(rows), lm_feature="mean")
    assert f.image_ids == ["a", "b"]
    assert f.failed_ids == ["bad"] and "broken.png" in f.failed_reasons["bad"]
    assert f.scores.shape == (2, 3, 3) and f.beam.shape == (2, 3, 5) and f.memory.shape == (2, 5, 5)
    assert f.mask.tolist() == [[True, True, True], [True, False, False]]
    assert f.memory_mask.tolist() == [[True, True, False, False, False], [False] * 5]
    np.testing.assert_allclose(f.raw_scores[0, :, 0].numpy(), [-1.0, -0.5, -2.0])
    assert torch.isnan(f.raw_scores[1, 1:]).all()
    # z over the valid beam; image b has a single candidate -> zeros
    np.testing.assert_allclose(f.scores[0].numpy(), zscore(f.raw_scores[:1], f.mask[:1])[0].numpy())
    assert torch.equal(f.scores[1], torch.zeros(3, 3)) and torch.equal(f.beam[1], torch.zeros(3, 5))
    # beam token columns: LM, cos, verifier, beam rank, n_tokens
    np.testing.assert_allclose(f.beam[0, :, 3].numpy(), zscore(torch.tensor([[1.0, 0.0, 2.0]]), f.mask[:1])[0])
    np.testing.assert_allclose(f.beam[0, :, 4].numpy(), zscore(torch.tensor([[4.0, 6.0, 3.0]]), f.mask[:1])[0])
    # memory: verifier, retrieval rank, length in words (3 and 2) -> +-1 each; pad dims 0
    np.testing.assert_allclose(f.memory[0, :2, :3].numpy(), [[1, 1, 1], [-1, -1, -1]], rtol=1e-6)
    assert torch.equal(f.memory[0, :, 3:], torch.zeros(5, 2)) and torch.equal(f.memory[0, 2:], torch.zeros(3, 5))
    assert f.texts == [["x y", "p q r", "s"], ["only"]]
    assert f.beam_rank[0].tolist() == [1, 0, 2]
    # the sum feature
    fs = load_features(rows_to_table(rows), lm_feature="sum")
    np.testing.assert_allclose(fs.raw_scores[0, :, 0].numpy(), [-4.0, -3.0, -6.0])
    with pytest.raises(ValueError, match="lm_feature"):
        load_features(rows_to_table(rows), lm_feature="max")


def test_nan_verifier_column_gives_zero_features():
    rows = [row("a", [cand("x", -1.0, 0.3, float("nan"), 0), cand("y", -2.0, 0.1, float("nan"), 1)])]
    f = load_features(rows_to_table(rows))
    assert torch.isfinite(f.scores).all() and torch.equal(f.scores[0, :, 2], torch.zeros(2))


def test_read_from_parquet_parts_directory(tmp_path):
    rows = synthetic_feature_rows(12, n_candidates=6, seed=3, short_every=4, error_every=5)
    d = tmp_path / "features" / "coco-val"
    d.mkdir(parents=True)
    pq.write_table(rows_to_table(rows[:7]), d / "part-00000.parquet")
    pq.write_table(rows_to_table(rows[7:]), d / "part-00001.parquet")
    (d / ".part-00002.parquet.123.tmp").write_bytes(b"half-written")  # ignored, like the writer's temp files
    f_dir = load_features(d)
    f_tab = load_features(rows_to_table(rows))
    f_file = load_features([d / "part-00000.parquet", d / "part-00001.parquet"])
    assert f_dir.image_ids == f_tab.image_ids == f_file.image_ids
    assert len(f_dir.failed_ids) == 2 and len(f_dir) == 10
    for name in ("scores", "beam", "memory", "mask", "memory_mask", "beam_rank"):
        assert torch.equal(getattr(f_dir, name), getattr(f_tab, name)), name
    with pytest.raises(FileNotFoundError, match="parquet"):
        load_features(tmp_path / "empty-dir-that-does-not-exist")


def test_rows_come_in_image_id_order_so_a_fit_does_not_depend_on_part_order(tmp_path):
    """A Ray job writes its parts in whatever order they finish: the same rows in another order must
    give the same features and, trained on them, the same heads (byte for byte)."""
    from adjcap.config import RerankCfg
    from adjcap.rerank import fit_heads

    rows = synthetic_feature_rows(24, n_candidates=6, seed=7, signal="verifier", error_every=9)
    shuffled = [rows[i] for i in np.random.default_rng(0).permutation(len(rows))]
    a, b = load_features(rows_to_table(rows)), load_features(rows_to_table(shuffled))
    assert a.image_ids == b.image_ids == sorted(a.image_ids)
    assert sorted(a.failed_ids) == sorted(b.failed_ids) and a.failed_ids
    for name in ("scores", "beam", "memory", "mask", "memory_mask", "beam_rank"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    cfg = RerankCfg.model_validate({"trifuse": {"epochs": 2}, "memattend": {"epochs": 2}})
    ha, hb = fit_heads(a, cfg, seed=3), fit_heads(b, cfg, seed=3)
    for head in ("trifuse", "memattend"):
        sa, sb = getattr(ha, head).state_dict(), getattr(hb, head).state_dict()
        assert all(torch.equal(sa[k], sb[k]) for k in sa), head


def test_duplicate_ids_and_foreign_tables_are_refused(tmp_path):
    rows = synthetic_feature_rows(3, n_candidates=4, seed=1)
    with pytest.raises(ValueError, match="appears twice"):
        load_features(rows_to_table(rows + rows[:1]))
    import pyarrow as pa

    with pytest.raises(ValueError, match="missing columns"):
        load_features(pa.table({"image_id": ["a"], "caption": ["x"]}))


def test_short_beam_padded_equals_unpadded():
    rows = synthetic_feature_rows(6, n_candidates=10, seed=5, short_every=3)
    short = [r for r in rows if len(r["candidates"]) < 10]
    assert short
    both = load_features(rows_to_table(rows))
    alone = load_features(rows_to_table(short[:1]))
    i = both.image_ids.index(short[0]["image_id"])
    k = len(short[0]["candidates"])
    assert alone.scores.shape[1] == k
    for name in ("scores", "beam"):
        np.testing.assert_allclose(getattr(both, name)[i, :k].numpy(), getattr(alone, name)[0].numpy(), atol=1e-6)
        assert torch.equal(getattr(both, name)[i, k:], torch.zeros_like(getattr(both, name)[i, k:]))
    np.testing.assert_allclose(both.memory[i].numpy(), alone.memory[0].numpy(), atol=1e-6)


# ---------------------------------------------------------------- no references, by construction


def _rerank_sources():
    return sorted((ROOT / "adjcap" / "rerank").glob("*.py"))


def test_rerank_does_not_import_data_metrics_or_the_runtime():
    forbidden = ("adjcap.data", "adjcap.metrics", "adjcap.report", "ray", "actors", "jobs", "cli")
    for path in _rerank_sources():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            for n in names:
                assert not any(n == f or n.startswith(f + ".") for f in forbidden), f"{path.name} imports {n}"
    code = (
        "import sys, adjcap.rerank; "
        "bad=[m for m in sys.modules if m.startswith(('adjcap.data','adjcap.metrics','ray','actors','jobs','cli'))]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_no_rerank_function_takes_references():
    suspicious = {"ref", "refs", "reference", "references", "gts", "annotation", "annotations", "ground", "gold"}
    seen = 0
    for modname in ["adjcap.rerank"] + [f"adjcap.rerank.{p.stem}" for p in _rerank_sources() if p.stem != "__init__"]:
        mod = __import__(modname, fromlist=["_"])
        for _, obj in inspect.getmembers(mod):
            if not str(getattr(obj, "__module__", "")).startswith("adjcap.rerank"):
                continue
            funcs = [obj] if inspect.isfunction(obj) else []
            if inspect.isclass(obj):
                funcs = [m for _, m in inspect.getmembers(obj, inspect.isfunction)]
            for fn in funcs:
                if not str(fn.__module__).startswith("adjcap.rerank"):
                    continue  # inherited from torch
                for p in inspect.signature(fn).parameters:
                    seen += 1
                    words = set(p.lower().split("_"))
                    assert not (words & suspicious), f"{fn.__qualname__} takes {p!r}"
    assert seen > 50
    # and only the four needed columns are read
    assert rerank.features.READ_COLUMNS == ("image_id", "error", "candidates", "verified")

"""Caption index: on-disk shards + manifest, exact top-k equal to the numpy brute force."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from adjcap.index import (
    MANIFEST,
    CaptionIndex,
    CaptionIndexError,
    IndexManifest,
    brute_force_topk,
    build_index,
    finalize_index,
    shard_files,
    unit_rows,
    verify_shard,
    write_shard,
)


def _random_unit(n: int, d: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return unit_rows(rng.standard_normal((n, d)).astype(np.float32))


def test_search_equals_brute_force_over_several_shards(tmp_path):
    vecs = _random_unit(1000, 24, 0)
    ids = np.random.default_rng(1).permutation(5000)[:1000].astype(np.int64)  # not 0..N-1
    m = build_index(tmp_path, vecs, ids, encoder_id="enc/x", corpus_fingerprint="c1", shard_size=300)
    assert [s.count for s in m.shards] == [300, 300, 300, 100]
    assert m.count == 1000 and m.dim == 24 and m.precision == "fp16"
    index = CaptionIndex.load(tmp_path, device="cpu")
    stored = np.concatenate([np.load(tmp_path / s.vectors) for s in m.shards]).astype(np.float32)
    q = _random_unit(37, 24, 2)
    # k larger than the last shard's 100 rows; small chunks force the cross-chunk merge
    for k in (1, 9, 150):
        scores, got = index.search(torch.from_numpy(q), k, query_batch=16, chunk_rows=128)
        ref_s, ref_i = brute_force_topk(q, stored, ids, k)
        assert scores.dtype == torch.float32 and got.dtype == torch.int64
        assert scores.shape == (37, k)
        np.testing.assert_array_equal(got.numpy(), ref_i)
        np.testing.assert_allclose(scores.numpy(), ref_s, atol=1e-5)
        assert np.all(np.diff(scores.numpy(), axis=1) <= 0)


def test_ties_break_by_smaller_corpus_id(tmp_path):
    # entries +-1/4 in 16 dims: unit norm exactly, every dot product exact in fp16/fp32 -> real ties
    rng = np.random.default_rng(3)
    base = np.where(rng.random((6, 16)) < 0.5, -0.25, 0.25).astype(np.float32)
    vecs = base[rng.integers(0, 6, size=200)]  # many exact duplicates (like repeated captions)
    ids = rng.permutation(200).astype(np.int64) * 7
    build_index(tmp_path, vecs, ids, encoder_id="e", corpus_fingerprint="c", shard_size=64)
    index = CaptionIndex.load(tmp_path, device="cpu")
    q = np.where(rng.random((10, 16)) < 0.5, -0.25, 0.25).astype(np.float32)
    for k in (5, 40, 77):
        scores, got = index.search(q, k, chunk_rows=50)
        ref_s, ref_i = brute_force_topk(q, vecs, ids, k)
        np.testing.assert_array_equal(got.numpy(), ref_i)
        np.testing.assert_array_equal(scores.numpy(), ref_s)
        # within equal scores the ids ascend
        s, i = scores.numpy(), got.numpy()
        same = s[:, 1:] == s[:, :-1]
        assert np.all(i[:, 1:][same] > i[:, :-1][same])
        assert same.any()


def test_ties_are_broken_with_one_host_read_per_chunk_whatever_the_rows(tmp_path):
    """A GPU stream waits for each host read: the tied rows of a chunk are resolved all at once, so 40
    queries (many rows tied at the k-th score) read the host as often as 4."""
    from adjcap.models.dispatch_audit import DispatchAudit

    rng = np.random.default_rng(5)
    base = np.where(rng.random((6, 16)) < 0.5, -0.25, 0.25).astype(np.float32)
    vecs = base[rng.integers(0, 6, size=300)]
    ids = rng.permutation(300).astype(np.int64) * 3
    build_index(tmp_path, vecs, ids, encoder_id="e", corpus_fingerprint="c", shard_size=128)
    index = CaptionIndex.load(tmp_path, device="cpu")
    q = np.where(rng.random((40, 16)) < 0.5, -0.25, 0.25).astype(np.float32)
    reads = {}
    for rows in (4, 40):
        audit = DispatchAudit()
        with audit:
            _, got = index.search(q[:rows], 9, chunk_rows=100)
        reads[rows] = sum(audit.reads.values())
        np.testing.assert_array_equal(got.numpy(), brute_force_topk(q[:rows], vecs, ids, 9)[1])
    assert reads[4] == reads[40], reads


def test_k_larger_than_index_and_streamed_batches(tmp_path):
    vecs = _random_unit(50, 8, 4)
    batches = (torch.from_numpy(vecs[i : i + 7]) for i in range(0, 50, 7))  # torch batches, default ids
    m = build_index(tmp_path, batches, encoder_id="e", corpus_fingerprint="c", shard_size=16, precision="fp32")
    assert m.count == 50 and len(m.shards) == 4 and m.precision == "fp32"
    index = CaptionIndex.load(tmp_path, device="cpu")
    scores, got = index.search(torch.from_numpy(vecs[:3]), 100)
    assert got.shape == (3, 50)
    assert got[:, 0].tolist() == [0, 1, 2]  # a vector is its own nearest neighbour
    np.testing.assert_allclose(scores[:, 0].numpy(), 1.0, atol=1e-6)
    assert sorted(got[0].tolist()) == list(range(50))


def test_manifest_written_last_and_mismatch_errors(tmp_path):
    vecs = _random_unit(40, 8, 5)
    build_index(tmp_path, vecs, encoder_id="ViT-B-32/openai", corpus_fingerprint="abc", shard_size=16)
    data = json.loads((tmp_path / MANIFEST).read_text())
    assert data["encoder_id"] == "ViT-B-32/openai" and data["corpus_fingerprint"] == "abc"
    assert all(len(s["sha256"]) == 64 and s["count"] for s in data["shards"])

    with pytest.raises(CaptionIndexError, match="encoder"):
        CaptionIndex.load(tmp_path, device="cpu", encoder_id="ViT-bigG-14/laion2b_s39b_b160k")
    with pytest.raises(CaptionIndexError, match="corpus"):
        CaptionIndex.load(tmp_path, device="cpu", corpus_fingerprint="other")

    # a shard file changed after the manifest was written
    vec_path, _, _ = shard_files(tmp_path, 1)
    arr = np.load(vec_path)
    arr[0, 0] += 0.5
    np.save(vec_path, arr)
    with pytest.raises(CaptionIndexError, match="shard-00001"):
        CaptionIndex.load(tmp_path, device="cpu")

    # a missing ids file
    build_index(tmp_path, vecs, encoder_id="e", corpus_fingerprint="c", shard_size=16)
    shard_files(tmp_path, 2)[1].unlink()
    with pytest.raises(CaptionIndexError, match="ids-00002.npy"):
        CaptionIndex.load(tmp_path, device="cpu")


def test_missing_manifest_is_a_clear_error(tmp_path):
    write_shard(tmp_path, 0, _random_unit(4, 8, 6), np.arange(4))
    with pytest.raises(CaptionIndexError, match="manifest.json does not exist"):
        CaptionIndex.load(tmp_path, device="cpu")


def test_partial_shard_is_never_taken_as_finished(tmp_path):
    vecs = _random_unit(30, 8, 7)
    info0 = write_shard(tmp_path, 0, vecs[:10], np.arange(10))
    write_shard(tmp_path, 1, vecs[10:20], np.arange(10, 20))
    assert verify_shard(tmp_path, 0) == info0
    # shard 2: vectors written, crash before ids + sidecar
    vec_path, ids_path, side_path = shard_files(tmp_path, 2)
    np.save(vec_path, vecs[20:].astype(np.float16))
    assert verify_shard(tmp_path, 2) is None
    with pytest.raises(CaptionIndexError, match="shard 2 unfinished"):
        finalize_index(tmp_path, encoder_id="e", corpus_fingerprint="c", num_shards=3)
    # a truncated vectors file under an existing sidecar
    write_shard(tmp_path, 2, vecs[20:], np.arange(20, 30))
    assert verify_shard(tmp_path, 2) is not None
    data = vec_path.read_bytes()
    vec_path.write_bytes(data[: len(data) // 2])
    assert verify_shard(tmp_path, 2) is None
    # resume: rewrite the damaged shard, then finalize and search
    write_shard(tmp_path, 2, vecs[20:], np.arange(20, 30))
    m = finalize_index(tmp_path, encoder_id="e", corpus_fingerprint="c", expected_count=30)
    assert m.count == 30 and IndexManifest.read(tmp_path).shards[2].count == 10
    index = CaptionIndex.load(tmp_path, device="cpu")
    _, got = index.search(vecs[25:26], 1)
    assert got.item() == 25


def test_duplicate_ids_and_bad_inputs_rejected(tmp_path):
    v = _random_unit(6, 4, 8)
    write_shard(tmp_path, 0, v[:3], np.array([0, 1, 2]))
    write_shard(tmp_path, 1, v[3:], np.array([2, 3, 4]))
    with pytest.raises(CaptionIndexError, match="repeat"):
        finalize_index(tmp_path, encoder_id="e", corpus_fingerprint="c")
    with pytest.raises(ValueError, match="ids"):
        write_shard(tmp_path, 3, v, np.arange(5))
    with pytest.raises(ValueError, match="queries"):
        CaptionIndex.from_arrays(v, device="cpu").search(np.zeros((2, 5), np.float32), 3)


def test_a_gpu_build_without_half_to_float_matmul_holds_the_index_in_fp32_and_says_so_once(monkeypatch, caplog):
    """ROCm builds without fp16 x fp16 -> fp32 matmul (simulated: the capability probe says no): the
    index is converted to fp32 once where it loads, with one log line per device, instead of a copy
    of every chunk in every search; a build that has it keeps fp16."""
    import logging

    from adjcap.index import search

    # the probe itself runs the op it checks (on the CPU here: this build has it or not, never an exception)
    assert search.half_matmul_f32(torch.device("cpu")) in (True, False)
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(search, "_SAID", set())
    monkeypatch.setattr(search, "half_matmul_f32", lambda dev: True)
    assert search.device_dtype(cuda, "fp16") == torch.float16
    monkeypatch.setattr(search, "half_matmul_f32", lambda dev: False)
    with caplog.at_level(logging.WARNING, logger=search.__name__):
        assert search.device_dtype(cuda, "fp16", 566_747, 1280) == torch.float32
        assert search.device_dtype(cuda, "fp16", 566_747, 1280) == torch.float32
    lines = [r.getMessage() for r in caplog.records if r.name == search.__name__]
    assert len(lines) == 1 and "no fp16 x fp16 -> fp32 matmul on cuda:0" in lines[0] and "2.70 GiB instead of 1.35" in lines[0]
    assert search.device_dtype(torch.device("cpu"), "fp16") == torch.float32  # the CPU path: fp32 chunks, as before

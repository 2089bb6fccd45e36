"""The index as the Ray job shares it (adjcap.index.shared): the same top-k as the loaded index, texts
by row, the arrays used in place (read-only, no copy) on the CPU, and through Ray's object store as
read-only views of shared memory."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from adjcap.index import (
    CaptionIndex,
    CaptionIndexError,
    TextTable,
    brute_force_topk,
    build_index,
    read_arrays,
    shard_files,
    shared_index,
    unit_rows,
)

TEXTS = [f"A caption number {i} with ünïcode {'x' * (i % 7)}." for i in range(700)]


def _index(tmp_path, precision="fp16"):
    vecs = unit_rows(np.random.default_rng(0).standard_normal((700, 32)).astype(np.float32))
    build_index(tmp_path, vecs, encoder_id="enc", corpus_fingerprint="c", shard_size=256, precision=precision)
    return tmp_path


def test_text_table_returns_each_text_by_row():
    table = TextTable.from_texts(TEXTS)
    assert len(table) == len(TEXTS)
    assert [table[i] for i in range(len(TEXTS))] == TEXTS and table[-1] == TEXTS[-1]
    with pytest.raises(IndexError):
        table[len(TEXTS)]
    assert len(TextTable.from_texts([])) == 0


@pytest.mark.parametrize("precision", ["fp16", "fp32"])
def test_shared_index_searches_like_the_loaded_index_without_copying(tmp_path, precision):
    out = _index(tmp_path, precision)
    shared = shared_index(out, TEXTS)
    assert shared.vectors.dtype == (np.float16 if precision == "fp16" else np.float32)
    shared.vectors.setflags(write=False)  # as Ray's object store hands them out
    index = shared.open("cpu")
    assert index.vectors.data_ptr() == shared.vectors.ctypes.data  # used in place, no copy
    loaded = CaptionIndex.load(out, device="cpu")
    q = torch.nn.functional.normalize(torch.randn(19, 32, generator=torch.Generator().manual_seed(3)), dim=-1)
    s_shared, i_shared = index.search(q, 25, query_batch=8, chunk_rows=100)
    s_loaded, i_loaded = loaded.search(q, 25)
    ref_s, ref_i = brute_force_topk(q.numpy(), shared.vectors.astype(np.float32), shared.ids, 25)
    np.testing.assert_array_equal(i_shared.numpy(), ref_i)
    np.testing.assert_array_equal(i_shared.numpy(), i_loaded.numpy())
    np.testing.assert_allclose(s_shared.numpy(), ref_s, atol=1e-5)
    assert shared.texts[int(i_shared[0, 0])] == TEXTS[int(i_shared[0, 0])]


def test_read_arrays_checks_the_shards(tmp_path):
    out = _index(tmp_path)
    vec_path, _, _ = shard_files(out, 1)
    data = bytearray(vec_path.read_bytes())
    data[-1] ^= 0xFF
    vec_path.write_bytes(bytes(data))
    with pytest.raises(CaptionIndexError, match="shard-00001.npy"):
        read_arrays(out)


def test_shared_index_refuses_a_corpus_shorter_than_the_index(tmp_path):
    with pytest.raises(ValueError, match="corpus has 10 texts"):
        shared_index(_index(tmp_path), TEXTS[:10])


@pytest.mark.slow
def test_through_the_object_store_the_arrays_are_shared_views(tmp_path):
    ray = pytest.importorskip("ray")
    shared = shared_index(_index(tmp_path), TEXTS)
    ray.init(address="local", num_cpus=1, object_store_memory=80 << 20, include_dashboard=False)
    try:
        ref = ray.put(shared)

        @ray.remote(num_cpus=0)
        def open_and_search(ref_list):
            got = ray.get(ref_list[0])
            index = got.open("cpu")
            _, ids = index.search(torch.ones(1, 32) / 32**0.5, 3)
            return got.vectors.flags.writeable, got.texts.blob.flags.writeable, [got.texts[int(i)] for i in ids[0]]

        writeable_v, writeable_t, texts = ray.get(open_and_search.remote([ref]))
    finally:
        ray.shutdown()
    assert not writeable_v and not writeable_t  # zero-copy views of the node's shared memory
    _, ids = shared.open("cpu").search(torch.ones(1, 32) / 32**0.5, 3)
    assert texts == [TEXTS[int(i)] for i in ids[0]]

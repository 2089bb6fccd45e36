"""The beam decode as a GPU would see it, counted on the CPU (adjcap.models.dispatch_audit): the fast beam
search reads the host at most once per 4 steps and never copies its whole KV cache in a step; the
audit itself catches the patterns it is there to catch (issue 38 items 1-2)."""

from __future__ import annotations


import pytest
import torch

from adjcap.models.decoding import CHECK_EVERY, beam_search_fast, beam_search_reference
from adjcap.models.dispatch_audit import DispatchAudit, audit_decode
from tiny_decoder import make_inputs, tiny_captioner

@pytest.fixture(scope="module")
def cap(tmp_path_factory):
    yield from tiny_captioner(tmp_path_factory.mktemp("tiny-audit"))


def prompts_for(cap, n: int, seed: int):
    x, r, ents = make_inputs(n, seed)
    return cap.prompt_embeddings(cap.soft_prompt(x, r), ents)


@pytest.mark.parametrize("width, max_len, batch", [(20, 20, 8), (5, 14, 6), (3, 30, None)])
def test_fast_beam_reads_the_host_once_per_4_steps_and_moves_no_whole_cache(cap, width, max_len, batch):
    ps = prompts_for(cap, 16, seed=width)
    got = {}
    a = audit_decode(cap.gpt, lambda: got.setdefault("beams", beam_search_fast(
        cap.gpt, ps, beam_width=width, max_len=max_len, stop_ids=cap.stop_ids, batch_size=batch)))
    chunks = -(-16 // (batch or 16))  # the prompt pass runs per chunk of `batch` images
    assert a["steps"] >= 4
    assert a["host_reads_per_step"] <= 1 / CHECK_EVERY, a["host_reads_by_site"]
    assert a["host_reads_once_per_batch"] <= 2 * chunks + 1, a["host_reads_by_site"]  # prompt passes + one gather
    assert a["kv_cache_bytes"] > 0
    assert a["kv_bytes_moved_max_step"] < a["kv_cache_bytes"], a  # no whole-cache copy in any step
    # per step: the new position's keys/values and the refill lanes' prompt rows (a new image's prompt
    # written once; idle lanes write a spare row), no reordering
    assert a["kv_bytes_moved_per_step"] <= a["kv_cache_bytes"] / 6, a
    # and the audited run is the ordinary search
    ref = [beam_search_reference(cap.gpt, p, beam_width=width, max_len=max_len, stop_ids=cap.stop_ids) for p in ps[:3]]
    assert [[b.tokens for b in bs] for bs in got["beams"][:3]] == [[b.tokens for b in bs] for bs in ref]


def test_audit_catches_host_reads_and_a_reordered_growing_cache():
    """The decode before issue 38 in miniature: a [rows, heads, positions, head_dim] cache
    reordered by index_select and grown by cat, a bool() and a tolist() per step."""
    rows, heads, dh = 6, 2, 4
    lm_steps = 5
    audit = DispatchAudit(kv_layout=(heads, dh))
    cache = torch.randn(rows, heads, 3, dh)
    with audit:
        for _ in range(lm_steps):
            audit.mark_step()
            done = torch.rand(rows) > 2
            if bool(done.any()):  # one _local_scalar_dense
                pass
            done.tolist()
            logp = torch.randn(rows, 10)
            logp[done] = float("-inf")  # a boolean-mask index_put_: a sync on a GPU
            cache = cache.index_select(0, torch.randperm(rows))
            cache = torch.cat([cache, torch.randn(rows, heads, 1, dh)], dim=2)
    s = audit.summary()
    assert s["host_reads_by_op"] == {"_local_scalar_dense.default": lm_steps, "Tensor.tolist": lm_steps,
                                     "index_put_.default[bool mask]": lm_steps}
    assert s["host_reads_per_step"] == 3
    assert s["kv_bytes_moved_per_step"] > s["kv_cache_bytes"]  # the whole cache, twice, each step


def test_the_beam_step_is_captured_whole_with_static_buffers(cap):
    """No graph break in a decode step (a host read or data-dependent Python would be one,
    ``torch._dynamo.explain``); ``fullgraph=True`` with static shapes (no ``dynamic``) compiles it once
    per rows shape for the whole decode, every position and every refill (the position is a tensor, the
    buffers are fixed: what a CUDA graph needs), with AOT autograd's functionalisation of the in-place KV writes
    (``aot_eager``), and returns the eager beams; a second call of the same shape reuses the graph."""
    from torch._dynamo.utils import counters

    import adjcap.models.decoding as decoding

    torch._dynamo.reset()
    ps = prompts_for(cap, 7, seed=4)
    want = beam_search_fast(cap.gpt, ps, beam_width=3, max_len=8, stop_ids=cap.stop_ids, batch_size=3)
    seen = {}

    def explained(gpt, st, stop, t, lam):
        seen["explain"] = torch._dynamo.explain(decoding._gpt_step)(gpt, st, stop, t, lam)

    beam_search_fast(cap.gpt, ps[:1], beam_width=3, max_len=8, stop_ids=cap.stop_ids, step=explained)
    ex = seen["explain"]
    assert ex.graph_break_count == 0 and ex.graph_count == 1, ex.break_reasons
    counters.clear()
    step = torch.compile(decoding._gpt_step, fullgraph=True, backend="aot_eager")
    try:
        got = beam_search_fast(cap.gpt, ps, beam_width=3, max_len=8, stop_ids=cap.stop_ids, batch_size=3, step=step)
        graphs = counters["stats"]["unique_graphs"]
        # one graph per rows shape: 3 slots, and the tail's 1 slot once the queue is empty (decoding._shrink)
        assert 1 <= graphs <= 2, dict(counters["stats"])
        again = beam_search_fast(cap.gpt, ps[2:], beam_width=3, max_len=8, stop_ids=cap.stop_ids, batch_size=3,
                                 step=step)
        assert counters["stats"]["unique_graphs"] == graphs, dict(counters["stats"])  # nothing recompiled
    finally:
        torch._dynamo.reset()
        decoding._KEPT_ROWS.clear()
    assert [[b.tokens for b in bs] for bs in got] == [[b.tokens for b in bs] for bs in want]
    assert [[b.tokens for b in bs] for bs in again] == [[b.tokens for b in bs] for bs in want[2:]]


def test_the_compiled_step_keeps_its_artifacts_in_the_configured_cache(monkeypatch, tmp_path):
    """captioner.compile_cache: torch's inductor and Triton caches are pointed under it before the first
    compile (a second process then loads instead of compiling: benchmarks/decoding.py --compile-cache);
    ``graphs`` is the CUDA-graph mode on a GPU and the plain compiled step elsewhere."""
    import os

    from torch._inductor.runtime.cache_dir_utils import cache_dir

    import adjcap.models.decoding as decoding

    for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        monkeypatch.setenv(var, "")  # restored after the test
        monkeypatch.delenv(var)
    monkeypatch.setattr(decoding, "COMPILE_BACKEND", "aot_eager")
    assert decoding.beam_step("off", "cpu", tmp_path) is decoding._gpt_step
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ  # off: nothing set
    step = decoding.beam_step("graphs", "cpu", tmp_path / "compile")
    assert step is decoding.compiled_step("aot_eager", "default")
    assert cache_dir() == str(tmp_path / "compile" / "inductor")
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "compile" / "triton")
    with pytest.raises(ValueError, match="captioner.compile"):
        decoding.beam_step("max-autotune", "cpu")

"""MemAttend's written-out training step and the fused C attention kernel: the same loss and
gradients as autograd through the stock layers, on both attention paths; clean fallback when the
kernel cannot be built; fitting gives the same bits on any number of threads."""

import platform
import stat

import pytest
import torch
from safetensors.torch import save as st_save

from adjcap.config import MemAttendCfg
from adjcap.features import rows_to_table
from adjcap.rerank import fit_memattend, load_features, native
from adjcap.rerank.borda import listwise_loss
from adjcap.rerank.heads import MemAttend
from adjcap.rerank.memattend_grad import MemAttendStep

AVX2 = platform.machine().lower() in ("x86_64", "amd64") and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


@pytest.fixture(autouse=True)
def _fresh_native(monkeypatch, tmp_path_factory):
    # every test builds into (or reuses) one private kernel directory and re-reads the environment
    monkeypatch.setenv("ADJCAP_NATIVE_DIR", str(tmp_path_factory.getbasetemp() / "kernels"))
    native.reset()
    yield
    native.reset()


def _batch(b=19, seed=1, masked=True):
    g = torch.Generator().manual_seed(seed)
    beam, memory = torch.randn(b, 20, 5, generator=g), torch.randn(b, 5, 5, generator=g)
    bm, mm = torch.ones(b, 20, dtype=torch.bool), torch.ones(b, 5, dtype=torch.bool)
    if masked:
        bm[1, 12:] = False  # short beam
        mm[2, 3:] = False  # fewer verified captions
        mm[3, :] = False  # none at all
        bm[4, :] = False  # no valid candidate: contributes nothing
    target = torch.softmax(torch.randn(b, 20, generator=g), -1).masked_fill(~bm, 0.0)
    target = target / target.sum(-1, keepdim=True).clamp_min(1e-9)
    return beam, memory, bm, mm, target


def _head():
    torch.manual_seed(0)
    h = MemAttend()
    with torch.no_grad():
        for p in h.parameters():  # move norms and biases off their initial values
            p.add_(0.1 * torch.randn_like(p))
    return h


def _autograd(h, beam, memory, bm, mm, target, w):
    loss = listwise_loss(h.forward_reference(beam, memory, bm, mm), target, bm)
    return float(loss.detach()), torch.autograd.grad(loss * w, list(h.parameters()))


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("fused", [False, True])
def test_step_matches_autograd(masked, fused):
    if fused and not AVX2:
        pytest.skip(f"the fused kernel needs x86-64 AVX2 (this is {platform.machine()}, {torch.backends.cpu.get_cpu_capability()})")
    if fused:
        assert native.why_not() is None  # x86-64 with AVX2 and a C compiler: the kernel must build
    h = _head()
    batch = _batch(masked=masked)
    ref_loss, ref = _autograd(h, *batch, 0.5)
    loss, grads = MemAttendStep(h, fused=fused)(*batch, 0.5)
    assert loss == pytest.approx(ref_loss, rel=1e-6)
    scale = max(float(g.abs().max()) for g in ref)
    for (name, _), a, b in zip(h.named_parameters(), ref, grads):
        assert b.shape == a.shape, name
        assert float((a - b).abs().max()) <= 2e-6 * scale, name


def test_image_without_any_token_adds_nothing():
    h = _head()
    beam, memory, bm, mm, target = _batch(masked=True)
    bm[5], mm[5] = False, False
    rest = [i for i in range(len(bm)) if i != 5]
    loss_all, g_all = MemAttendStep(h)(beam, memory, bm, mm, target)
    loss_rest, g_rest = MemAttendStep(h)(beam[rest], memory[rest], bm[rest], mm[rest], target[rest])
    assert loss_all == pytest.approx(loss_rest, rel=1e-6)
    for a, b in zip(g_all, g_rest):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_disabled_kernel_falls_back_to_torch_ops(monkeypatch):
    monkeypatch.setenv("ADJCAP_NATIVE", "0")
    assert native.library() is None and "ADJCAP_NATIVE=0" in native.why_not()
    h = _head()
    batch = _batch()
    with pytest.raises(RuntimeError, match="not usable"):
        MemAttendStep(h, fused=True)
    loss, grads = MemAttendStep(h)(*batch)  # auto: torch ops
    ref_loss, ref = _autograd(h, *batch, 1.0)
    assert loss == pytest.approx(ref_loss, rel=1e-6)
    torch.testing.assert_close(grads[0], ref[0], atol=1e-6, rtol=1e-4)


@pytest.mark.skipif(not AVX2, reason="the kernel is only built on x86-64 with AVX2")
def test_failed_build_warns_once_and_falls_back(monkeypatch, tmp_path):
    broken = tmp_path / "broken-cc"
    broken.write_text("#!/bin/sh\necho 'broken-cc: cannot compile' >&2\nexit 1\n")
    broken.chmod(broken.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("CC", str(broken))
    monkeypatch.setenv("ADJCAP_NATIVE_DIR", str(tmp_path / "k"))
    with pytest.warns(RuntimeWarning, match="could not build"):
        assert native.library() is None
    assert "broken-cc: cannot compile" in native.why_not()
    assert not list((tmp_path / "k").glob("*.so"))  # no half-written library left behind
    feats = load_features(rows_to_table(_rows(12)))
    f = fit_memattend(feats, MemAttendCfg(epochs=2))
    assert len(f.losses) == 2


@pytest.mark.skipif(not AVX2, reason="the kernel is only built on x86-64 with AVX2")
def test_kernel_is_built_once_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("ADJCAP_NATIVE_DIR", str(tmp_path))
    assert native.library() is not None
    built = list(tmp_path.glob("adjcap_memattend_*.so"))
    assert len(built) == 1
    mtime = built[0].stat().st_mtime_ns
    native.reset()
    assert native.library() is not None
    assert built[0].stat().st_mtime_ns == mtime


def _rows(n):
    from adjcap.demo.synthetic import synthetic_feature_rows

    return synthetic_feature_rows(n, 12, seed=4, short_every=3)


def _bytes(module):
    return st_save({k: v.contiguous() for k, v in module.state_dict().items()})


def test_fit_is_identical_on_any_number_of_threads():
    feats = load_features(rows_to_table(_rows(600)))  # several chunks of 256 images
    cfg = MemAttendCfg(epochs=3)
    one = fit_memattend(feats, cfg, threads=1)
    two = fit_memattend(feats, cfg, threads=2)
    three = fit_memattend(feats, cfg, threads=3)
    assert _bytes(one.head) == _bytes(two.head) == _bytes(three.head)
    assert one.losses == two.losses == three.losses
    assert (one.threads, two.threads) == (1, 2)


@pytest.mark.parametrize("kw", [{"layers": 1}, {"layers": 3, "d_model": 24, "heads": 4, "ffn": 40}])
def test_step_matches_autograd_for_other_shapes(kw):
    # one layer: no folded first projection; head width 6: the torch-op attention path
    torch.manual_seed(3)
    h = MemAttend(**kw)
    batch = _batch(b=9, masked=True)
    ref_loss, ref = _autograd(h, *batch, 1.0)
    loss, grads = MemAttendStep(h)(*batch, 1.0)
    assert loss == pytest.approx(ref_loss, rel=1e-6)
    scale = max(float(g.abs().max()) for g in ref)
    for (name, _), a, b in zip(h.named_parameters(), ref, grads):
        assert float((a - b).abs().max()) <= 2e-6 * scale, name

"""TriFuse / MemAttend: exact parameter counts, the stock transformer layers, masking (a padded beam
scores like the unpadded one), and the registry of head specs."""

import pytest
import torch
from torch import nn

from adjcap.config import RerankCfg, load_config
from adjcap.engine.features import rows_to_table
from adjcap.rerank import HEADS, MemAttend, TriFuse, count_params, head_spec, load_features
from adjcap.demo.synthetic import synthetic_feature_rows


def test_trifuse_has_113_parameters():
    h = TriFuse(hidden=8)
    assert count_params(h) == 113
    assert [tuple(p.shape) for p in h.parameters()] == [(8, 3), (8,), (8, 8), (8,), (1, 8), (1,)]
    assert any(isinstance(m, nn.GELU) for m in h.modules())
    assert h(torch.zeros(2, 20, 3)).shape == (2, 20)


def test_memattend_has_17377_parameters():
    h = MemAttend(d_model=32, layers=2, heads=4, ffn=64)
    assert count_params(h) == 17_377
    assert count_params(h.w_in) == 192
    assert count_params(h.role) == 64
    assert sum(count_params(layer) for layer in h.layers) == 17_088
    assert count_params(h.head) == 33
    for layer in h.layers:
        assert isinstance(layer, nn.TransformerEncoderLayer)
        assert layer.self_attn.num_heads == 4 and layer.linear1.out_features == 64
        assert layer.activation is torch.nn.functional.gelu and layer.norm_first is False
        assert all(getattr(layer, d).p == 0.0 for d in ("dropout", "dropout1", "dropout2"))
    assert h(torch.zeros(2, 20, 5), torch.zeros(2, 5, 5), torch.ones(2, 20, dtype=torch.bool),
             torch.ones(2, 5, dtype=torch.bool)).shape == (2, 20)


def _inputs(seed=0, b=6, n=20, m=5):
    g = torch.Generator().manual_seed(seed)
    beam, memory = torch.randn(b, n, 5, generator=g), torch.randn(b, m, 5, generator=g)
    bm, mm = torch.ones(b, n, dtype=torch.bool), torch.ones(b, m, dtype=torch.bool)
    if b > 3:
        bm[1, 12:] = False
        mm[2, 3:] = False
        mm[3, :] = False  # no verified memory at all
    return beam, memory, bm, mm


def test_padding_does_not_change_scores():
    torch.manual_seed(1)
    h = MemAttend().eval()
    t = TriFuse().eval()
    beam, memory, bm, mm = _inputs(seed=3, b=1, n=7, m=3)
    # the same image padded to 20 beam slots and 5 memory slots with garbage in the padding
    pb = torch.cat([beam, 100 * torch.randn(1, 13, 5)], dim=1)
    pm = torch.cat([memory, -50 * torch.randn(1, 2, 5)], dim=1)
    pbm = torch.cat([bm, torch.zeros(1, 13, dtype=torch.bool)], dim=1)
    pmm = torch.cat([mm, torch.zeros(1, 2, dtype=torch.bool)], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(h(pb, pm, pbm, pmm)[:, :7], h(beam, memory, bm, mm), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(t(pb[..., :3])[:, :7], t(beam[..., :3]))


def test_head_specs_build_and_feed_each_head():
    assert HEADS.names() == ["trifuse", "memattend"]
    feats = load_features(rows_to_table(synthetic_feature_rows(3, 6, seed=0)))
    r = load_config("headline").rerank
    for name in HEADS:
        spec = HEADS.get(name)
        head = spec.build(spec.settings(r))
        assert type(head) is spec.cls and head_spec(head) is spec and head_spec(name) is spec
        assert {k: head.config()[k] for k in spec.arch} == {k: getattr(getattr(r, name), k) for k in spec.arch}
        assert head(*spec.inputs(feats)).shape == (3, 6)
    assert count_params(HEADS.get("memattend").build(RerankCfg().memattend)) == 17_377


def test_unknown_head_lists_known_ones():
    with pytest.raises(ValueError, match=r"unknown head 'memattnd'; did you mean 'memattend'\? \(known: trifuse, memattend\)"):
        HEADS.get("memattnd")
    with pytest.raises(TypeError, match="unknown head type Linear"):
        head_spec(nn.Linear(1, 1))

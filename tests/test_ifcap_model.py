"""IFCap re-implementation: module layout vs spec 2.3, the mapping network's maths vs an independent
functional version written from spec 1.2-1.3, and the strict loader (real-size layout on the meta
device, tiny model through the real loader)."""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from adjcap.demo.tiny_ifcap import build_tiny_ifcap, train_gpt2_tokenizer, with_gpt2_mask_buffers
from adjcap.models.gpt2_tokenizer import TokenizerLoadError, load_gpt2_tokenizer, stop_token_ids
from adjcap.models.ifcap import (
    CheckpointMismatchError,
    ClipCaptionModel,
    MappingDims,
    check_state_dict,
    gpt2_config,
    infer_mapping_dims,
    load_ifcap,
    prepare_state_dict,
)

FIXTURES = Path(__file__).parent / "fixtures" / "data"
CLIP_DIM = 24


def corpus() -> list[str]:
    data = json.loads((FIXTURES / "coco_test_captions.json").read_text())
    return [c for caps in data.values() for c in caps]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-ifcap")
    tok = train_gpt2_tokenizer(corpus(), root / "gpt2-tokenizer", vocab_size=400)
    pt = build_tiny_ifcap(root / "ifcap", tok, clip_dim=CLIP_DIM, seed=42)
    return pt, tok


# --------------------------------------------------------------------------------------------
# Real-size layout on the meta device
# --------------------------------------------------------------------------------------------


def official_keys_and_shapes() -> dict[str, tuple[int, ...]]:
    """Spec 2.3, written out independently of the implementation."""
    D, V, P, C, H = 768, 50257, 1024, 512, 1536
    out: dict[str, tuple[int, ...]] = {
        "gpt.transformer.wte.weight": (V, D),
        "gpt.transformer.wpe.weight": (P, D),
    }
    for i in range(12):
        h = f"gpt.transformer.h.{i}."
        out.update({
            h + "ln_1.weight": (D,), h + "ln_1.bias": (D,),
            h + "attn.bias": (1, 1, P, P), h + "attn.masked_bias": (),
            h + "attn.c_attn.weight": (D, 3 * D), h + "attn.c_attn.bias": (3 * D,),
            h + "attn.c_proj.weight": (D, D), h + "attn.c_proj.bias": (D,),
            h + "ln_2.weight": (D,), h + "ln_2.bias": (D,),
            h + "mlp.c_fc.weight": (D, 4 * D), h + "mlp.c_fc.bias": (4 * D,),
            h + "mlp.c_proj.weight": (4 * D, D), h + "mlp.c_proj.bias": (D,),
        })
    out.update({"gpt.transformer.ln_f.weight": (D,), "gpt.transformer.ln_f.bias": (D,), "gpt.lm_head.weight": (V, D)})
    out.update({
        "mapping_network.prefix_const": (10, D),
        "mapping_network.linear.weight": (10 * D, C), "mapping_network.linear.bias": (10 * D,),
        "mapping_network.rt_linear.weight": (D, C), "mapping_network.rt_linear.bias": (D,),
    })
    layers = [f"mapping_network.transformer.layers.{j}." for j in range(8)]
    layers.append("mapping_network.crossatt.transformer.layers.0.")
    for p in layers:
        out.update({
            p + "norm1.weight": (D,), p + "norm1.bias": (D,),
            p + "attn.to_queries.weight": (D, D), p + "attn.to_keys_values.weight": (2 * D, D),
            p + "attn.project.weight": (D, D), p + "attn.project.bias": (D,),
            p + "norm2.weight": (D,), p + "norm2.bias": (D,),
            p + "mlp.fc1.weight": (H, D), p + "mlp.fc1.bias": (H,),
            p + "mlp.fc2.weight": (D, H), p + "mlp.fc2.bias": (D,),
        })
    return out


@pytest.fixture(scope="module")
def meta_model():
    with torch.device("meta"):
        return ClipCaptionModel(gpt2_config("gpt2"), MappingDims(), mapping_heads=8)


def meta_official_state_dict() -> OrderedDict:
    """A state dict with the released file's 286 names and shapes, as meta tensors (no allocation)."""
    sd = OrderedDict()
    for k, shape in official_keys_and_shapes().items():
        dtype = torch.uint8 if k.endswith("attn.bias") and len(shape) == 4 else torch.float32
        sd[k] = torch.empty(shape, dtype=dtype, device="meta")
    return sd


def test_real_size_parameter_counts(meta_model):
    assert sum(p.numel() for p in meta_model.mapping_network.parameters()) == 46_864_128
    # parameters() counts the tied lm_head/wte once, as the spec's count does
    assert sum(p.numel() for p in meta_model.gpt.parameters()) == 124_439_808
    assert meta_model.gpt.lm_head.weight is meta_model.gpt.transformer.wte.weight


def test_real_size_state_dict_keys_equal_spec(meta_model):
    spec = official_keys_and_shapes()
    assert len(spec) == 286
    ours = {k: tuple(v.shape) for k, v in meta_model.state_dict().items()}
    masks = {k for k in spec if k.endswith(".attn.bias") or k.endswith(".attn.masked_bias")}
    assert len(masks) == 24
    assert ours == {k: v for k, v in spec.items() if k not in masks}
    assert list(dict(meta_model.named_children())) == ["gpt", "mapping_network"]
    # the builder's file layout (mask buffers after each ln_1) gives exactly the spec's 286 entries
    with_masks = with_gpt2_mask_buffers(meta_model.state_dict(), 12, 1024)
    assert {k: tuple(v.shape) for k, v in with_masks.items()} == spec
    assert list(with_masks)[2:6] == [
        "gpt.transformer.h.0.ln_1.weight", "gpt.transformer.h.0.ln_1.bias",
        "gpt.transformer.h.0.attn.bias", "gpt.transformer.h.0.attn.masked_bias",
    ]


def test_loader_key_handling_accepts_the_released_layout(meta_model):
    sd = meta_official_state_dict()
    assert len(sd) == 286
    assert infer_mapping_dims(sd) == MappingDims()
    out = prepare_state_dict(sd, meta_model, "coco-indomain-004.pt")
    assert len(out) == 262
    assert "gpt.transformer.h.3.attn.c_attn.bias" in out
    assert not any(k.endswith(".attn.bias") or k.endswith(".attn.masked_bias") for k in out)
    # lm_head absent -> tied from wte, still strict
    del sd["gpt.lm_head.weight"]
    out = prepare_state_dict(sd, meta_model)
    assert out["gpt.lm_head.weight"] is out["gpt.transformer.wte.weight"]


@pytest.mark.parametrize(
    "edit, expect",
    [
        (lambda sd: sd.pop("gpt.transformer.h.5.attn.c_attn.bias"), "missing keys (1): gpt.transformer.h.5.attn.c_attn.bias"),
        (lambda sd: sd.__setitem__("module.extra", torch.empty(3, device="meta")), "unexpected keys (1): module.extra"),
        (
            lambda sd: sd.__setitem__("gpt.transformer.h.12.attn.bias", torch.empty(1, 1, 4, 4, device="meta")),
            "unexpected keys (1): gpt.transformer.h.12.attn.bias",
        ),
        (
            lambda sd: sd.__setitem__("mapping_network.transformer.layers.2.mlp.fc1.weight", torch.empty(1536, 700, device="meta")),
            "mapping_network.transformer.layers.2.mlp.fc1.weight: checkpoint (1536, 700) vs model (1536, 768)",
        ),
    ],
)
def test_loader_key_handling_refuses_wrong_keys_and_shapes(meta_model, edit, expect):
    sd = meta_official_state_dict()
    edit(sd)
    with pytest.raises(CheckpointMismatchError) as e:
        prepare_state_dict(sd, meta_model, "some.pt")
    assert expect in str(e.value)
    assert str(e.value).startswith("some.pt: ")


def test_check_state_dict_lists_everything():
    with pytest.raises(CheckpointMismatchError) as e:
        check_state_dict({"a": torch.zeros(2), "b": torch.zeros(3)}, {"a": (3,), "c": (1,)})
    msg = str(e.value)
    assert "missing keys (1): c" in msg and "unexpected keys (1): b" in msg and "a: checkpoint (2,) vs model (3,)" in msg


# --------------------------------------------------------------------------------------------
# Mapping network vs a functional version of spec 1.2-1.3
# --------------------------------------------------------------------------------------------


def _ref_block(sd, p, q, kv, heads):
    """One TBlock from the spec's steps, from raw tensors."""
    d = q.shape[-1]
    hd = d // heads
    h = F.layer_norm(q, (d,), sd[p + "norm1.weight"], sd[p + "norm1.bias"], eps=1e-5)
    src = h if kv is None else kv  # a given kv is NOT layer-normed
    Q = h @ sd[p + "attn.to_queries.weight"].T
    Wkv = sd[p + "attn.to_keys_values.weight"]
    K = src @ Wkv[:d].T  # rows 0..d-1 produce keys
    Vv = src @ Wkv[d:].T  # rows d..2d-1 produce values
    outs = []
    for j in range(heads):
        sl = slice(j * hd, (j + 1) * hd)
        a = (Q[..., sl] @ K[..., sl].transpose(-1, -2) * hd**-0.5).softmax(-1)
        outs.append(a @ Vv[..., sl])
    O = torch.cat(outs, -1) @ sd[p + "attn.project.weight"].T + sd[p + "attn.project.bias"]
    q = q + O
    m = F.layer_norm(q, (d,), sd[p + "norm2.weight"], sd[p + "norm2.bias"], eps=1e-5)
    m = torch.relu(m @ sd[p + "mlp.fc1.weight"].T + sd[p + "mlp.fc1.bias"]) @ sd[p + "mlp.fc2.weight"].T
    return q + m + sd[p + "mlp.fc2.bias"]


def _ref_mapping(sd, x, r, heads, n_layers):
    pre = "mapping_network."
    d = sd[pre + "rt_linear.weight"].shape[0]
    X = (x @ sd[pre + "linear.weight"].T + sd[pre + "linear.bias"]).view(x.shape[0], -1, d)
    R = r @ sd[pre + "rt_linear.weight"].T + sd[pre + "rt_linear.bias"]
    Fz = _ref_block(sd, pre + "crossatt.transformer.layers.0.", X, R, heads)
    Z = torch.cat([Fz, sd[pre + "prefix_const"].expand(x.shape[0], -1, -1)], 1)
    for j in range(n_layers):
        Z = _ref_block(sd, pre + f"transformer.layers.{j}.", Z, None, heads)
    return Z[:, X.shape[1]:]


def test_mapping_network_matches_spec_maths(tiny):
    pt, tok = tiny
    cap = load_ifcap(pt, lm_config=pt.parent, tokenizer=tok, device="cpu", mapping_heads=2)
    sd = torch.load(pt, weights_only=True)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, CLIP_DIM, generator=g)
    r = torch.randn(3, 5, CLIP_DIM, generator=g) * 4.0  # raw scale, not normalised
    soft = cap.soft_prompt(x, r)
    assert soft.shape == (3, 10, 32)
    xn = x / x.norm(dim=-1, keepdim=True)
    ref = _ref_mapping(sd, xn, r, heads=2, n_layers=2)
    torch.testing.assert_close(soft, ref, rtol=1e-5, atol=1e-5)
    # image features are normalised inside; retrieved features are not
    torch.testing.assert_close(cap.soft_prompt(7.0 * x, r), soft, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(cap.soft_prompt(x, 2.0 * r), soft, atol=1e-4)
    # no positional information: the order of the retrieved captions does not matter
    torch.testing.assert_close(cap.soft_prompt(x, r[:, [3, 0, 4, 2, 1]]), soft, rtol=1e-5, atol=1e-5)
    # k may differ from training's 5
    assert cap.soft_prompt(x, r[:, :2]).shape == (3, 10, 32)
    with pytest.raises(ValueError, match="retrieved_feats"):
        cap.soft_prompt(x, r[:2])


def test_prompt_embeddings_are_soft_then_hard(tiny):
    pt, tok = tiny
    cap = load_ifcap(pt, lm_config=pt.parent, tokenizer=tok, device="cpu", mapping_heads=2)
    soft = cap.soft_prompt(torch.randn(2, CLIP_DIM), torch.randn(2, 5, CLIP_DIM))
    ents = [["man", "surfboard", "wave"], []]
    prompts = cap.prompt_embeddings(soft, ents)
    for s, p, e in zip(soft, prompts, ents):
        text = "There are man, surfboard, wave in image." if e else "There are something in image."
        ids = cap.tokenizer.encode(text, add_special_tokens=False)
        assert cap.tokenizer.decode(ids) == text
        assert p.shape == (10 + len(ids), 32)
        torch.testing.assert_close(p[:10], s)
        torch.testing.assert_close(p[10:], cap.gpt.transformer.wte.weight[ids])


# --------------------------------------------------------------------------------------------
# Loader on the tiny model (the real file layout, mask buffers included)
# --------------------------------------------------------------------------------------------


def test_tiny_file_has_the_released_layout(tiny):
    pt, _ = tiny
    sd = torch.load(pt, weights_only=True)
    masks = [k for k in sd if k.endswith(".attn.bias") or k.endswith(".attn.masked_bias")]
    assert masks == [
        "gpt.transformer.h.0.attn.bias", "gpt.transformer.h.0.attn.masked_bias",
        "gpt.transformer.h.1.attn.bias", "gpt.transformer.h.1.attn.masked_bias",
    ]
    bias = sd["gpt.transformer.h.0.attn.bias"]
    assert bias.dtype == torch.uint8 and bias.shape == (1, 1, 128, 128)
    assert torch.equal(bias[0, 0], torch.tril(torch.ones(128, 128, dtype=torch.uint8)))
    assert float(sd["gpt.transformer.h.1.attn.masked_bias"]) == -1e4
    assert list(sd)[:2] == ["gpt.transformer.wte.weight", "gpt.transformer.wpe.weight"]
    assert all(v.dtype == torch.float32 for k, v in sd.items() if k not in masks)
    assert infer_mapping_dims(sd) == MappingDims(CLIP_DIM, 32, 10, 10, 2, 1, 64)
    cfg = json.loads((pt.parent / "config.json").read_text())
    assert cfg["n_embd"] == 32 and cfg["n_layer"] == 2 and cfg["vocab_size"] == len(load_gpt2_tokenizer(tiny[1]))


def test_tiny_builder_is_deterministic(tiny, tmp_path):
    pt, tok = tiny
    again = build_tiny_ifcap(tmp_path / "again", tok, clip_dim=CLIP_DIM, seed=42)
    a, b = torch.load(pt, weights_only=True), torch.load(again, weights_only=True)
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    other = torch.load(build_tiny_ifcap(tmp_path / "other", tok, clip_dim=CLIP_DIM, seed=7), weights_only=True)
    assert not torch.equal(a["mapping_network.linear.weight"], other["mapping_network.linear.weight"])


def test_load_tiny_loads_every_weight(tiny):
    pt, tok = tiny
    cap = load_ifcap(pt, lm_config=pt.parent, tokenizer=tok, device="cpu", mapping_heads=2)
    sd = torch.load(pt, weights_only=True)
    ours = cap.model.state_dict()
    assert set(ours) == set(sd) - {k for k in sd if k.endswith(".attn.bias") or k.endswith(".attn.masked_bias")}
    for k, v in ours.items():
        assert torch.equal(v, sd[k]), k
    assert cap.gpt.lm_head.weight is cap.gpt.transformer.wte.weight
    assert not cap.model.training and not cap.gpt.training
    assert cap.stop_ids == stop_token_ids(cap.tokenizer)
    assert cap.tokenizer.decode([cap.stop_ids[0]]) == "."


def test_load_rejects_wrong_architecture(tiny, tmp_path):
    pt, tok = tiny
    with pytest.raises(ValueError, match="not divisible by 3 heads"):
        load_ifcap(pt, lm_config=pt.parent, tokenizer=tok, device="cpu", mapping_heads=3)
    # the built-in GPT-2 small config does not fit the tiny weights: strict check lists the problem
    with pytest.raises(ValueError, match="n_embd=768"):
        load_ifcap(pt, lm_config="gpt2", tokenizer=tok, device="cpu", mapping_heads=2)
    cfg = json.loads((pt.parent / "config.json").read_text())
    cfg["n_layer"] = 3
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointMismatchError, match=r"missing keys \(\d+\): gpt.transformer.h.2.ln_1.weight"):
        load_ifcap(pt, lm_config=tmp_path, tokenizer=tok, device="cpu", mapping_heads=2)
    sd = torch.load(pt, weights_only=True)
    sd["gpt.transformer.h.0.attn.c_attn.bias"] = torch.zeros(5)
    torch.save(sd, tmp_path / "bad.pt")
    with pytest.raises(CheckpointMismatchError, match=r"gpt.transformer.h.0.attn.c_attn.bias: checkpoint \(5,\) vs model \(96,\)"):
        load_ifcap(tmp_path / "bad.pt", lm_config=pt.parent, tokenizer=tok, device="cpu", mapping_heads=2)


def test_load_errors_name_the_file_and_where_to_get_it(tiny, tmp_path):
    pt, tok = tiny
    missing = tmp_path / "checkpoints" / "train_coco" / "coco-indomain-004.pt"
    with pytest.raises(FileNotFoundError) as e:
        load_ifcap(missing)
    assert str(missing) in str(e.value) and "v1.0" in str(e.value) and "checkpoints.zip" in str(e.value)
    torch.save({"state_dict": {"x": torch.zeros(1)}}, tmp_path / "wrapped.pt")
    with pytest.raises(CheckpointMismatchError, match="wrapped.pt"):
        load_ifcap(tmp_path / "wrapped.pt", lm_config=pt.parent, tokenizer=tok)
    (tmp_path / "junk.pt").write_bytes(b"not a torch file")
    with pytest.raises(CheckpointMismatchError, match="junk.pt"):
        load_ifcap(tmp_path / "junk.pt", lm_config=pt.parent, tokenizer=tok)
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_ifcap(pt, lm_config=tmp_path / "nowhere", tokenizer=tok, mapping_heads=2)


def test_real_size_random_state_dict_through_check(meta_model):
    # a strict load of the real layout with values: only the small mapping-net part is materialised
    sd = meta_official_state_dict()
    for k in list(sd):
        if k.startswith("mapping_network."):
            sd[k] = torch.zeros(sd[k].shape)
    out = prepare_state_dict(sd, meta_model)
    assert out["mapping_network.prefix_const"].shape == (10, 768)


# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------


def test_trained_tokenizer_loads_as_gpt2_fast(tiny):
    from transformers import GPT2TokenizerFast

    _, tok_dir = tiny
    tok = GPT2TokenizerFast.from_pretrained(str(tok_dir))
    text = "There are man, surfboard, wave in image."
    ids = tok.encode(text)
    assert tok.decode(ids) == text  # byte-level, no prefix space, no BOS added
    assert tok.eos_token == "<|endoftext|>"
    assert "." in tok.get_vocab()
    assert len(stop_token_ids(tok)) >= 1 and tok.encode(".") == [stop_token_ids(tok)[0]]


def test_tokenizer_errors_are_actionable(tmp_path):
    with pytest.raises(TokenizerLoadError, match="tokenizer.json"):
        load_gpt2_tokenizer(tmp_path)  # exists, but empty
    with pytest.raises(TokenizerLoadError, match="does not exist"):
        load_gpt2_tokenizer(tmp_path / "missing-dir")
    with pytest.raises(TokenizerLoadError, match="captioner.tokenizer"):
        load_gpt2_tokenizer("gpt2")  # offline in tests: no hub, nothing cached

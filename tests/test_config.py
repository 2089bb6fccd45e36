import tomllib

import pytest

from adjcap.config import Config, ConfigError, list_presets, load_config
from adjcap.engine.identity import feature_identity

PAPER_PRESETS = {
    "headline", "training-free", "transductive", "ifcap", "verifier-flickr", "demo",
    *(f"ablation-{i}" for i in range(1, 9)),
}


def test_every_paper_preset_exists_and_validates():
    presets = list_presets()
    assert PAPER_PRESETS <= set(presets)
    for name in presets:
        cfg = load_config(name)
        assert cfg.name == name
        assert presets[name], f"preset {name} has no description"


def test_headline_is_the_papers_method():
    cfg = load_config("headline")
    assert cfg.retrieval.encoder.model == "ViT-bigG-14"
    assert cfg.retrieval.encoder.pretrained == "laion2b_s39b_b160k"
    assert cfg.retrieval.top_l == 9 and cfg.verifier.keep == 5
    assert cfg.verifier.model == "Salesforce/blip-itm-large-coco"
    assert cfg.captioner.entities.threshold == 3 and cfg.captioner.entities.pool == "verified"
    assert cfg.captioner.beam_width == 20
    assert cfg.rerank.picker == "ensemble" and cfg.rerank.protocol == "inductive"
    assert (cfg.rerank.alpha, cfg.rerank.beta) == (0.48, 0.75)
    assert cfg.rerank.trifuse.lr == 1e-2 and cfg.rerank.trifuse.epochs == 100
    assert cfg.rerank.memattend.lr == 3e-3 and cfg.rerank.memattend.epochs == 200
    assert cfg.seed == 42


def test_ifcap_preset_matches_official_settings():
    cfg = load_config("ifcap")
    assert (cfg.retrieval.encoder.model, cfg.retrieval.encoder.pretrained) == ("RN50x64", "openai")
    assert not cfg.verifier.enabled
    assert cfg.captioner.entities.threshold == 5 and cfg.captioner.entities.pool == "retrieved"
    assert cfg.captioner.beam_width == 5 and cfg.rerank.picker == "lm"
    flickr = load_config("ifcap-flickr30k")
    assert flickr.captioner.decoder == "greedy" and flickr.retrieval.top_l == 7
    nocaps = load_config("ifcap-nocaps")
    assert nocaps.captioner.entities.mode == "clip_classifier"


def test_ablation_rows_differ_in_the_factor_they_name():
    r1, r3, r4, r5, r6 = (load_config(f"ablation-{i}") for i in (1, 3, 4, 5, 6))
    assert r3.captioner.entities.threshold == 3 and not r3.verifier.enabled
    assert r4.verifier.enabled and r4.captioner.entities.threshold == 5
    assert r5.verifier.enabled and r5.captioner.entities.threshold == 3
    assert r6.retrieval.encoder.model == "ViT-bigG-14" and r5.retrieval.encoder.model == r1.retrieval.encoder.model


def test_paper_presets_run_fp32_and_precision_is_one_switch():
    for name in set(list_presets()) - {"gpu"}:  # gpu: the speed preset, not the paper (below)
        cfg = load_config(name).resolved()
        encoders = [cfg.retrieval.encoder, cfg.captioner.clip, cfg.eval.clipscore, cfg.scorer_encoder()]
        assert all(e.precision == "fp32" for e in encoders) and cfg.verifier.precision == "fp32", name
        assert cfg.captioner.precision == "fp32"
        # fidelity: exact fp32 matmuls, row-count text batches, transformers' own BLIP attention
        assert not cfg.tf32 and cfg.verifier.attention == "eager", name
        assert cfg.verifier.text_token_budget == 0 and all(e.text_token_budget == 0 for e in encoders), name
    gpu = load_config("gpu").resolved()
    encoders = [gpu.retrieval.encoder, gpu.eval.clipscore, gpu.scorer_encoder()]
    assert {e.precision for e in encoders} == {gpu.verifier.precision} == {"bf16"}
    # the captioner keeps its own: its CLIP in bf16 moved the beams (benchmarks/results/captioner-clip-bf16-demo.json)
    assert gpu.captioner.precision == gpu.captioner.clip.precision == "fp32"
    assert gpu.tf32 and gpu.verifier.attention == "sdpa"
    assert gpu.verifier.text_token_budget > 0 and all(e.text_token_budget > 0 for e in encoders)
    assert gpu.eval.clipscore.same_model(gpu.scorer_encoder())  # one bigG for the scorer and CLIPScore
    fast = load_config("output-scorer-vitb32", ["precision=bf16"])
    assert fast.retrieval.encoder.precision == "fp32"  # the saved config keeps the sections as given
    r = fast.resolved()
    assert {e.precision for e in (r.retrieval.encoder, r.eval.clipscore, r.scorer.encoder)} == {"bf16"}
    assert r.verifier.precision == "bf16" and r.captioner.precision == r.captioner.clip.precision == "fp32"
    assert feature_identity(fast)["precision"] == "bf16" != feature_identity(load_config("headline"))["precision"]
    one = load_config("headline", ["verifier.precision=bf16"]).resolved()
    assert one.verifier.precision == "bf16" and one.retrieval.encoder.precision == "fp32"
    # a model's precision the root switch would override is refused in one line, not silently dropped
    with pytest.raises(ConfigError, match=r"verifier.precision=fp32 would have no effect: the root "
                                          r"precision=bf16 .* set precision=none"):
        load_config("gpu", ["verifier.precision=fp32"])
    with pytest.raises(ConfigError, match="eval.clipscore.precision=fp16 would have no effect"):
        load_config("headline", [], updates={"precision": "bf16", "eval.clipscore.precision": "fp16"})
    assert load_config("gpu", ["verifier.precision=bf16"]).resolved().verifier.precision == "bf16"
    own = load_config("gpu", ["precision=none", "retrieval.encoder.precision=bf16", "eval.clipscore.precision=bf16",
                              "verifier.precision=fp32"]).resolved()
    assert (own.verifier.precision, own.retrieval.encoder.precision) == ("fp32", "bf16")
    # the root switch leaves the captioner's models: their own settings take effect beside it
    assert load_config("gpu", ["captioner.clip.precision=bf16"]).resolved().captioner.clip.precision == "bf16"


def test_scorer_and_clipscore_encoders_are_their_own_settings():
    head = load_config("headline")
    assert head.scorer.encoder is None and head.scorer_encoder() == head.retrieval.encoder
    assert (head.eval.clipscore.model, head.eval.clipscore.pretrained) == ("ViT-bigG-14", "laion2b_s39b_b160k")
    ifcap = load_config("ifcap")  # scored with bigG CLIPScore although it retrieves with RN50x64
    assert ifcap.eval.clipscore == head.eval.clipscore and ifcap.scorer_encoder().model == "RN50x64"
    swap = load_config("output-scorer-vitb32")
    assert (swap.scorer_encoder().model, swap.scorer_encoder().pretrained) == ("ViT-B-32", "openai")
    assert swap.retrieval.encoder == head.retrieval.encoder
    ids = feature_identity(swap), feature_identity(load_config("training-free"))
    assert ids[0]["scorer.encoder.model"] == "ViT-B-32" and ids[1]["scorer.encoder.model"] == "ViT-bigG-14"
    xf, xn = load_config("xdomain-flickr30k"), load_config("xdomain-nocaps")
    assert xf.benchmark == "flickr30k" and xf.rerank.protocol == "transductive" and "flickr" in xf.captioner.checkpoint
    assert xn.benchmark == "nocaps" and xn.captioner.entities.mode == "clip_classifier"
    assert load_config("ablation-lm-sum").scorer.lm_feature == "sum"


def test_overrides_parse_types_and_nested_keys():
    cfg = load_config("headline", ["verifier.model=x/y", "rerank.alpha=0.3", "captioner.beam_width=7",
                                   "verifier.enabled=false", 'splits=["test"]', "ray.pool.verifier.gpus=0.5"])
    assert cfg.verifier.model == "x/y" and cfg.rerank.alpha == 0.3 and cfg.captioner.beam_width == 7
    assert cfg.verifier.enabled is False and cfg.splits == ["test"] and cfg.ray.pool["verifier"].gpus == 0.5


@pytest.mark.parametrize("override,needle", [
    ("verifier.modle=x", "verifier.modle"),
    ("nope=1", "nope"),
    ("rerank.alpha=3", "rerank.alpha"),
    ("rerank.picker=best", "rerank.picker"),
    ("rerank.picker=ensembel", "did you mean 'ensemble'"),
    ("rerank.device=gpu", "rerank.device"),
    ("rerank.batch_images=0", "rerank.batch_images"),
    ("captioner.beam_width=zero", "captioner.beam_width"),
    ("benchmarks.coco.formt=x", "benchmarks.coco.formt"),
    ("noequals", "noequals"),
])
def test_bad_override_names_the_key(override, needle):
    with pytest.raises(ConfigError) as e:
        load_config("headline", [override])
    assert needle in str(e.value)


def test_unknown_preset_lists_known_ones():
    with pytest.raises(ConfigError) as e:
        load_config("no-such-preset")
    assert "headline" in str(e.value)


def test_resolved_config_round_trips_through_toml(tmp_path):
    cfg = load_config("demo", ["rerank.beta=0.6"])
    path = tmp_path / "config.toml"
    path.write_text(cfg.to_toml())
    tomllib.loads(path.read_text())
    again = load_config(config_file=path)
    assert again == cfg


def test_placeholders_expand(tmp_path):
    cfg = load_config("demo", [f"paths.cache_dir={tmp_path}"])
    r = cfg.resolved()
    assert r.verifier.model == f"{tmp_path}/tiny/blip-itm"
    assert r.benchmarks["demo"].images == f"{tmp_path}/demo/images"
    assert cfg.verifier.model == "{cache}/tiny/blip-itm"  # the config itself keeps its placeholders
    home = Config(paths={"cache_dir": "~/c", "data_dir": "~/d"}).resolved()
    assert not home.paths.cache_dir.startswith("~") and not home.captioner.checkpoint.startswith(("~", "{"))
    assert r.resolved() == r  # idempotent

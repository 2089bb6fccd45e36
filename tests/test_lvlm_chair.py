"""`adjcap reproduce lvlm-chair` and the vlm family's settings, without Ray: the table's runs (greedy,
beam, ensemble per prompt, a seeded sample of each split), `prepare --for` a known checkpoint and its
size in the memory plan, paired intervals between picks of two runs against a direct computation, the
judges' text windows and the count of cut candidates, and the hostile settings refused in one line
before Ray starts (adjcap.jobs.preflight)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from adjcap.config import ConfigError, load_config
from adjcap.reproduce import distinct_runs, get_table, plan_table


def test_the_table_runs_greedy_beam_and_heads_per_prompt_on_a_seeded_sample(tmp_path):
    plans = plan_table(get_table("lvlm-chair"), None, [], {"captioner.vlm.model": "Qwen/Qwen2.5-VL-3B-Instruct"},
                       tmp_path)
    runs = distinct_runs(plans)
    assert len(runs) == 6  # per prompt: greedy, the beam (its LM and fixed picks), the ensemble heads
    prompts = {(p.resolved.captioner.vlm.prompt, p.resolved.captioner.decoder, p.resolved.rerank.protocol)
               for p in runs}
    assert prompts == {(q, d, pr) for q in ("detail", "short")
                       for d, pr in (("greedy", "training-free"), ("beam", "training-free"), ("beam", "inductive"))}
    for p in runs:
        r = p.resolved
        assert (r.captioner.family, r.captioner.vlm.model, r.sample, r.eval.chair) == \
            ("vlm", "Qwen/Qwen2.5-VL-3B-Instruct", 500, "both")
    heads = [p for p in runs if p.resolved.rerank.protocol == "inductive"]
    assert all(set(p.resolved.splits) == {"val", "test"} for p in heads)  # fitted on val, applied on test


def test_a_seeded_sample_is_stable_and_ordered():
    from adjcap.engine.run_plan import sample_records

    recs = list(range(100))
    a, b = sample_records(recs, 10, "42:test"), sample_records(recs, 10, "42:test")
    assert a == b and a == sorted(a) and len(set(a)) == 10
    assert sample_records(recs, 10, "43:test") != a
    assert sample_records(recs, 500, "42:test") == recs


def test_prepare_knows_the_checkpoints_and_the_memory_plan_their_sizes(tmp_path):
    from adjcap.engine import captioners
    from adjcap.models.budget import VLM_PARAMS
    from adjcap.prepare.targets import configs_for

    assert set(VLM_PARAMS) == {"llava-hf/llava-1.5-7b-hf", "Qwen/Qwen2.5-VL-3B-Instruct",
                               "HuggingFaceTB/SmolVLM-256M-Instruct"}
    for ckpt, n in VLM_PARAMS.items():
        cfgs = configs_for(ckpt, tmp_path)
        assert cfgs and all(c.captioner.vlm.model == ckpt for c in cfgs)
        weights = [w for w in __import__("adjcap.models.sources", fromlist=["x"]).weights_of(cfgs[0])
                   if w.role == "vision-language captioner"]
        assert [(w.kind, w.name, w.tag) for w in weights] == [("hf", ckpt, "vlm")]
        assert captioners.family("vlm").size(cfgs[0], True) == (n, 2 * n)  # bf16 on a GPU
        assert captioners.family("vlm").size(cfgs[0], False) == (n, 4 * n)  # fp32 on a CPU


def test_max_new_tokens_zero_is_one_line():
    with pytest.raises(ConfigError) as e:
        load_config("headline", ["captioner.family=vlm", "captioner.vlm.max_new_tokens=0"])
    assert "captioner.vlm.max_new_tokens" in str(e.value) and "\n" not in str(e.value)


def test_preflight_refuses_a_prompt_without_the_image_and_a_text_only_checkpoint(tmp_path):
    from transformers import GPT2Config

    from adjcap.demo.tiny_vlm import build_tiny_vlm
    from adjcap.jobs.preflight import vlm_problem

    d = build_tiny_vlm(tmp_path / "llava", "llava", ["a dog on a bench."], seed=1)
    ok = load_config("headline", ["captioner.family=vlm", f"captioner.vlm.model={d}"])
    assert vlm_problem(ok) is None
    raw = load_config("headline", ["captioner.family=vlm", f"captioner.vlm.model={d}", "captioner.vlm.chat_template=false",
                                   "captioner.vlm.prompt=USER: describe it. ASSISTANT:"])
    why = vlm_problem(raw)
    assert why and "'<image>'" in why and "captioner.vlm.prompt" in why and "\n" not in why
    GPT2Config(n_layer=1, n_embd=8, n_head=2).save_pretrained(tmp_path / "gpt2")
    text = load_config("headline", ["captioner.family=vlm", f"captioner.vlm.model={tmp_path / 'gpt2'}"])
    why = vlm_problem(text)
    assert why and "not an image-text-to-text model" in why and "\n" not in why


class _Run:
    def __init__(self, rows):
        self.rows = rows

    def per_image(self, protocol, picker):
        return self.rows


def test_paired_intervals_across_runs_equal_a_direct_computation():
    from adjcap.report.paired_runs import paired_across

    rng = np.random.default_rng(0)
    ids = [str(i) for i in range(40)]

    def rows(bias):
        return {i: {"CIDEr": float(rng.normal(50 + bias, 5)), "CHAIR_mentioned": int(m), "CHAIR_hallucinated": int(h),
                    "CHAIR_objects": 3, "CHAIR_recalled": int(rng.integers(0, 4)), "words": int(rng.integers(5, 60))}
                for i in ids for m in [rng.integers(1, 6)] for h in [rng.integers(0, m + 1) if bias else 0]}

    a, b = rows(0), rows(1)
    d = paired_across(_Run(a), "p", "x", _Run(b), "p", "y")
    va = np.array([[a[i]["CHAIR_mentioned"], a[i]["CHAIR_hallucinated"]] for i in ids], float)
    vb = np.array([[b[i]["CHAIR_mentioned"], b[i]["CHAIR_hallucinated"]] for i in ids], float)
    assert d["CHAIR_i"].delta == pytest.approx(100 * (va[:, 1].sum() / va[:, 0].sum() - vb[:, 1].sum() / vb[:, 0].sum()))
    assert d["CHAIR_s"].delta == pytest.approx(-100 * np.mean([b[i]["CHAIR_hallucinated"] > 0 for i in ids]))
    assert d["words"].delta == pytest.approx(np.mean([a[i]["words"] - b[i]["words"] for i in ids]))
    assert d["recall"].delta == pytest.approx(100 * (sum(a[i]["CHAIR_recalled"] for i in ids)
                                                     - sum(b[i]["CHAIR_recalled"] for i in ids)) / 120)
    for x in d.values():
        assert x.n_images == 40 and x.low <= x.delta <= x.high


def test_judge_windows_and_cut_counts(tmp_path):
    from adjcap.config import VerifierCfg
    from adjcap.demo.tiny_blip import train_wordpiece_tokenizer
    from adjcap.models.judge_window import cut_count, window

    tok = train_wordpiece_tokenizer(["a dog on a bench next to a red car."])
    tok.save_pretrained(tmp_path / "bert")
    short, long = "a dog on a bench.", " ".join(["a red car next to a dog on a bench"] * 8)
    blip = VerifierCfg(family="blip_itm", model=str(tmp_path / "bert"))
    assert window(blip)[0] == 35
    assert cut_count([short, long, long], blip) | {"how": ""} == {"judge": "blip_itm", "window": 35, "how": "",
                                                               "long_captions": "whole", "candidates": 3, "cut": 2}
    clip = VerifierCfg(family="clip", model="ViT-B-32", pretrained="openai")
    assert window(clip)[0] == 77
    assert cut_count([short, long], clip)["cut"] == 1  # 73 words + start and end > 77
    assert cut_count([short, " ".join(["dog"] * 75)], clip)["cut"] == 0  # 75 + 2 = 77 fits


@pytest.mark.slow
def test_lvlm_chair_on_the_demo_world_end_to_end(demo_cfg, tmp_path):
    """`adjcap reproduce lvlm-chair --benchmark demo --limit 4`: the tiny LLaVA built on first use, every
    row run, the table written with the proxy CHAIR, recall, length and CIDEr (no instance annotations on the
    demo world: n/a), each row's paired intervals against greedy, the judge's cut counts and the sample.
    The rows run in this process (``executor=local``; the protocol is the subject, not Ray)."""
    import json

    from typer.testing import CliRunner

    from adjcap.cli import app

    runs = tmp_path / "runs"
    args = ["reproduce", "lvlm-chair", "--benchmark", "demo", "--limit", "4", "--runs-dir", str(runs), "--workers", "1",
            "--set", f"paths.cache_dir={demo_cfg.paths.cache_dir}", "--set", "ray.include_dashboard=false",
            "--set", f"cache.stages_dir={tmp_path / 'stages'}", "--set", "executor=local"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert (Path(demo_cfg.paths.cache_dir) / "tiny" / "vlm-llava" / "READY.json").is_file()
    doc = json.loads((runs / "reproduce" / "lvlm-chair-demo.json").read_text())
    assert len(doc["rows"]) == 8 and all(r["status"] == "ok" for r in doc["rows"]), doc["rows"]
    for r in doc["rows"]:
        m = r["measured"]
        assert m["CHAIR_s"] is None and m["CHAIR_s proxy"] is not None and m["words"] > 0
        assert m["CIDEr"] is not None and m["recall proxy"] is not None
    paired = doc["paired_differences"]
    for d in get_table("lvlm-chair").differences:
        got = {p["metric"]: p for p in paired if p["label"] == d.label}
        assert {"CHAIR_s", "CHAIR_i", "words", "CIDEr"} <= set(got), (d.label, got)
        for p in got.values():
            assert p["images"] == 4 and p["low"] <= p["delta"] <= p["high"]
    cut = doc["cut_candidates"]
    assert len(cut) == 6 and all(c["judge"] == "blip_itm" and c["window"] == 35 for c in cut)
    assert all(0 <= c["cut"] <= c["candidates"] and c["candidates"] > 0 for c in cut)
    assert sorted(doc["sample_ids"]) == ["test"] and len(doc["sample_ids"]["test"]) == 4
    md = (runs / "reproduce" / "lvlm-chair-demo.md").read_text()
    assert "detail: greedy" in md and "short: beam, ensemble heads (fit on val)" in md


@pytest.mark.parametrize("hostile", ["prompt", "max_new_tokens", "checkpoint"])
def test_a_hostile_vlm_setting_is_one_line_before_ray_starts(tmp_path, monkeypatch, hostile):
    """`adjcap run-job coco` with each hostile setting of the issue: exit 2, one error line naming the
    setting, and Ray never started (its session replaced by a failure here)."""
    from transformers import GPT2Config
    from typer.testing import CliRunner

    from adjcap.cli import app
    from adjcap.demo.tiny_vlm import build_tiny_vlm
    from adjcap.jobs import run

    def no_ray(*a, **k):
        raise AssertionError("Ray started")

    monkeypatch.setattr(run, "job_session", no_ray)
    llava = build_tiny_vlm(tmp_path / "llava", "llava", ["a dog on a bench."], seed=1)
    GPT2Config(n_layer=1, n_embd=8, n_head=2).save_pretrained(tmp_path / "gpt2")
    sets = {"prompt": [f"captioner.vlm.model={llava}", "captioner.vlm.chat_template=false",
                       "captioner.vlm.prompt=USER: describe it. ASSISTANT:"],
            "max_new_tokens": [f"captioner.vlm.model={llava}", "captioner.vlm.max_new_tokens=0"],
            "checkpoint": [f"captioner.vlm.model={tmp_path / 'gpt2'}"]}[hostile]
    args = ["run-job", "coco", "--run-dir", str(tmp_path / "run"), "--set", "captioner.family=vlm",
            "--set", f"paths.cache_dir={tmp_path / 'cache'}", "--set", f"paths.data_dir={tmp_path / 'data'}"]
    res = CliRunner().invoke(app, [*args, *(x for s in sets for x in ("--set", s))])
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and "Ray started" not in res.output, res.output
    said = {"prompt": "captioner.vlm.prompt", "max_new_tokens": "captioner.vlm.max_new_tokens",
            "checkpoint": "not an image-text-to-text model"}[hostile]
    assert said in lines[0], lines[0]

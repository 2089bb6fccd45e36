"""Every preset end to end on the demo world, so a preset that cannot finish is caught.

Each preset keeps its method settings (verifier on/off, L, k, K, beam, decoder, entity mode, picker,
protocol, splits, LM feature, output scorer) and gets the demo world's tiny models and data
(:func:`jobs.demo.on_demo_world`). Features come from the in-process pipeline (the same stage
functions the Ray pools run), computed once per distinct feature identity and shared between presets
that agree on it; then the real fit step (jobs/fit.py), evaluation and report (jobs/run.py
``finish``) run in each preset's own run directory, as `adjcap run-job` does after extraction.
"""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from adjcap.config import Config, list_presets, load_config
from adjcap.engine.identity import feature_identity
from adjcap.engine.features import rows_to_table
from adjcap.engine.pipeline import load_models, run_pipeline
from adjcap.storage.rundir import RunDir
from adjcap.engine.run_plan import read_records
from adjcap.jobs import fit, extract_features
from adjcap.jobs.demo import on_demo_world
from adjcap.jobs.run import finish

LIMIT = 6  # images per split
PRESETS = sorted(list_presets())
FINISHED: dict[str, RunDir] = {}


class FeatureStore:
    """Feature rows per (feature identity, split), computed once; models per identity, loaded once."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], list[dict]] = {}
        self.models: dict[str, object] = {}

    def get(self, cfg: Config, split: str, records) -> list[dict]:
        ident = json.dumps(feature_identity(cfg), sort_keys=True, default=str)
        if (ident, split) not in self.rows:
            if ident not in self.models:
                self.models.clear()  # keep one model set in memory
                self.models[ident] = load_models(cfg)
            self.rows[(ident, split)] = run_pipeline(records, cfg, self.models[ident])
        return self.rows[(ident, split)]


@pytest.fixture(scope="module")
def store() -> FeatureStore:
    return FeatureStore()


def preset_on_demo(name: str, demo_cfg: Config) -> Config:
    cfg = load_config(name, [f"paths.cache_dir={demo_cfg.paths.cache_dir}",
                             f"paths.runs_dir={demo_cfg.paths.runs_dir}", f"limit={LIMIT}"])
    return on_demo_world(cfg)


def run_preset(cfg: Config, run: RunDir, store: FeatureStore) -> dict:
    """What `adjcap run-job` does, with the features from the in-process pipeline."""
    rcfg = cfg.resolved()
    records = read_records(rcfg)
    with run.lock():
        run.check_identity(feature_identity(cfg), fresh=False)
        run.write_config(cfg.to_toml())
        extract_features.write_references(run, rcfg.benchmark, records)
        for split, recs in records.items():
            run.write_part(rcfg.benchmark, split, rows_to_table(store.get(rcfg, split, recs)))
        fit.main(rcfg, run)
        finish(rcfg, run, records)
    return records


def test_every_preset_is_tested():
    assert {"headline", "ifcap", "demo", "xdomain-flickr30k", "xdomain-nocaps", "ablation-lm-sum",
            "output-scorer-vitb32"} <= set(PRESETS)
    assert len(PRESETS) >= 20


def test_on_demo_world_keeps_the_method_and_swaps_the_models(demo_cfg):
    paper = load_config("ifcap-nocaps")
    demo = on_demo_world(paper)
    assert demo.benchmark == "demo" and demo.retrieval.encoder.model == "adjcap-tiny-clip-large"
    assert demo.captioner.checkpoint.endswith("tiny-ifcap.pt") and demo.eval.clipscore.model == "adjcap-tiny-clip-large"
    for key in ("verifier.enabled", "retrieval.top_l", "captioner.beam_width", "captioner.entities.mode",
                "captioner.entities.threshold", "captioner.entities.pool", "rerank.picker", "rerank.protocol",
                "splits", "scorer.lm_feature"):
        a, b = paper, demo
        for part in key.split("."):
            a, b = getattr(a, part), getattr(b, part)
        assert a == b, key
    swap = on_demo_world(load_config("output-scorer-vitb32"))
    assert swap.scorer.encoder == load_config("demo").captioner.clip  # loaded apart from stage 1's encoder
    # the gpu preset's speed settings run on the demo's models (its parity: docs/benchmarks/real-size.md)
    gpu = on_demo_world(load_config("gpu"))
    assert gpu.precision == "bf16" and gpu.tf32 and gpu.verifier.attention == "sdpa" and gpu.verifier.text_token_budget
    assert gpu.retrieval.encoder.model == "adjcap-tiny-clip-large"
    assert gpu.retrieval.encoder.text_token_budget == load_config("gpu").retrieval.encoder.text_token_budget > 0


# every preset's end-to-end run (features, fit, evaluation with its Java, report): make test runs them,
# make test-fast (everyday work, no end-to-end job) does not
@pytest.mark.slow
@pytest.mark.parametrize("name", PRESETS)
def test_preset_finishes_fit_evaluate_and_report(name, demo_cfg, store, tmp_path_factory):
    cfg = preset_on_demo(name, demo_cfg)
    run = RunDir(tmp_path_factory.mktemp("presets") / name)
    records = run_preset(cfg, run, store)
    r = cfg.rerank

    # the preset's stage settings reached the features
    for split in records:
        rows = run.read_features(cfg.benchmark, split).to_pylist()
        assert len(rows) == LIMIT and all(row["error"] is None for row in rows), [row["error"] for row in rows]
        width = 1 if cfg.captioner.decoder == "greedy" else cfg.captioner.beam_width
        for row in rows:
            assert len(row["retrieved"]) == cfg.retrieval.top_l
            assert len(row["verified"]) == cfg.verifier.keep
            assert len(row["candidates"]) == width
            ver = [c["verifier"] for c in row["candidates"]]
            assert all(math.isnan(v) for v in ver) if not cfg.verifier.enabled else all(0 < v < 1 for v in ver)
            assert all(-1 <= c["clipscore_cosine"] <= 1 for c in row["candidates"])
            if cfg.scorer.encoder is None:  # CLIPScore encoder = output scorer on the demo world: reused
                assert all(c["clipscore_cosine"] == c["retrieval_cosine"] for c in row["candidates"])

    # fit: the configured picker's predictions; a picker whose inputs are absent is not applicable
    assert run.predictions_path(r.protocol, r.picker).exists()
    na = run.fit_summary(r.protocol)["not_applicable"]
    assert ("verifier" in na) == (not cfg.verifier.enabled)
    assert all(not run.predictions_path(r.protocol, p).exists() for p in na)
    if r.protocol != "training-free":
        heads = json.loads(run.heads_json_path.read_text())
        assert heads["meta"]["lm_feature"] == cfg.scorer.lm_feature

    # evaluate: metrics of the configured picker, CLIPScore from the fixed CLIPScore encoder
    doc = json.loads(run.metrics_path(r.protocol).read_text())
    m = doc["pickers"][r.picker]
    assert m["n_images"] == LIMIT and m["metrics"]["CIDEr"] is not None and m["metrics"]["CIDEr"] >= 0
    assert m["clipscore"]["source"] == "clipscore_cosine" and m["clipscore"]["encoder"].startswith("adjcap-tiny-clip")

    # report
    md = run.report_md.read_text()
    assert f"## {run.path.name}" in md and f"| {r.protocol} | {r.picker} |" in md
    if not cfg.verifier.enabled:
        assert f"| {r.protocol} | verifier: not applicable (" in md
    FINISHED[name] = run


def finished(name: str, demo_cfg: Config, store: FeatureStore, tmp_path_factory) -> RunDir:
    """The run of preset ``name`` from this module's parametrized test, or a fresh one (-k runs)."""
    if name not in FINISHED:
        run = RunDir(tmp_path_factory.mktemp("presets") / name)
        run_preset(preset_on_demo(name, demo_cfg), run, store)
        FINISHED[name] = run
    return FINISHED[name]


@pytest.mark.slow  # two presets end to end (make test-fast runs no end-to-end job)
def test_heads_fitted_on_one_run_apply_to_another(demo_cfg, store, tmp_path_factory):
    """`adjcap fit --run B --heads A/heads`: fit on one benchmark, apply to another."""
    from adjcap.cli import app
    from adjcap.rerank import load_features, load_heads, pick

    a, b = finished("demo", demo_cfg, store, tmp_path_factory), finished("xdomain-nocaps", demo_cfg, store, tmp_path_factory)
    res = CliRunner().invoke(app, ["fit", "--run", str(b.path), "--heads", str(a.heads_dir)])
    assert res.exit_code == 0, res.output
    assert f"heads from {a.heads_dir}" in res.output
    saved = json.loads(b.heads_json_path.read_text())
    assert saved["meta"]["applied_from"] == str(a.heads_dir)
    cfg = load_config(config_file=b.config_path).resolved()
    heads = load_heads(a.heads_dir, cfg)
    feats = load_features(b.read_features(cfg.benchmark, "test"), lm_feature="mean")
    want = pick(feats, "ensemble", heads, beta=cfg.rerank.beta)
    got = {e["image_id"]: e["candidate_index"] for e in b.predictions("transductive", "ensemble")}
    assert [got[i] for i in feats.image_ids] == [int(x) for x in want]
    # heads fitted on the summed LM feature do not apply to a mean-feature run
    summed = finished("ablation-lm-sum", demo_cfg, store, tmp_path_factory)
    bad = CliRunner().invoke(app, ["fit", "--run", str(b.path), "--heads", str(summed.heads_dir)])
    assert bad.exit_code == 2 and "scorer.lm_feature" in bad.output

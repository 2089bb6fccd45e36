"""Captioner families through the stages (adjcap.engine.captioners): a demo run's candidates exported from its
samples.parquet and fed back through captioner.family = candidates give the same picks as the run that
made them, for every picker (exactly); an hf captioner runs through the in-process pipeline; an IFCap
config's stage identities count none of the other families' settings (existing runs keep theirs)."""

from __future__ import annotations

import pyarrow.parquet as pq

from adjcap.config import load_config
from adjcap.data.candidates import write_candidates
from adjcap.engine.features import rows_to_table
from adjcap.engine.identity import config_identity
from adjcap.index.lifecycle import search_corpus
from adjcap.jobs import extract_features, fit, preflight
from adjcap.jobs.run import finish
from adjcap.engine.pipeline import Models, load_models, run_pipeline
from adjcap.storage.rundir import RunDir
from adjcap.engine.run_plan import read_records
from adjcap.storage.samples import candidates_of
from adjcap.engine.stage_cache import stage_identities
from adjcap.engine import stage_registry

LIMIT = 4


def _run(cfg, models, path) -> RunDir:
    """What `adjcap run-job` does, with the features from the in-process pipeline."""
    rcfg = cfg.resolved()
    run = RunDir(path)
    records = read_records(rcfg)
    with run.lock():
        run.write_config(cfg.to_toml())
        extract_features.write_references(run, rcfg.benchmark, records)
        for split, recs in records.items():
            run.write_part(rcfg.benchmark, split, rows_to_table(run_pipeline(recs, rcfg, models)))
        fit.main(rcfg, run)
        finish(rcfg, run, records)
    return run


def _picks(run: RunDir) -> dict:
    return {(proto, picker): run.predictions(proto, picker)
            for proto in run.prediction_protocols() for picker in run.prediction_files(proto)}


def test_exported_candidates_give_the_same_picks(demo_cfg, tmp_path):
    base = [f"paths.cache_dir={demo_cfg.paths.cache_dir}", f"paths.runs_dir={tmp_path}", f"limit={LIMIT}"]
    cfg = load_config("demo", base)
    models = load_models(cfg)
    made = _run(cfg, models, tmp_path / "ifcap")
    samples = pq.read_table(made.path / "samples.parquet")
    rows = candidates_of(samples)
    assert len(rows) == 2 * LIMIT and all(len(r["candidates"]) == cfg.captioner.beam_width for r in rows)
    for c in samples.column("candidates").to_pylist():  # the beam's order is the list's: ranks survive
        assert [x["beam_rank"] for x in c] == list(range(len(c)))
    file = write_candidates(tmp_path / "candidates.jsonl", rows)

    again = load_config("demo", [*base, "captioner.family=candidates", f"captioner.candidates.file={file}"])
    assert preflight.candidates_problem(again.resolved()) is None
    fed = Models(**{**vars(models), "captioner": stage_registry.family("captioner").load(again.resolved(), None)})
    assert fed.captioner.judge is None  # the file has every log-prob: no LM judge
    back = _run(again, fed, tmp_path / "candidates")

    assert f"Captioner: candidates from {file}; their log-probs from the file" in back.report_md.read_text()
    picks, picks_back = _picks(made), _picks(back)
    assert len(picks) >= 5 and picks == picks_back
    for split in ("val", "test"):
        a, b = (r.read_features("demo", split).to_pylist() for r in (made, back))
        assert [x["candidates"] for x in a] == [x["candidates"] for x in b]  # every judge's score, bit for bit


def test_an_hf_captioner_runs_through_the_pipeline(demo_cfg, tmp_path):
    from adjcap.demo.tiny_hf_captioner import build_tiny_hf_captioner

    corpus = search_corpus(demo_cfg.resolved().retrieval, demo_cfg.resolved().benchmark_cfg(), "demo",
                           demo_cfg.resolved().paths.cache_dir)
    model = build_tiny_hf_captioner(tmp_path / "blip", "blip", list(corpus.texts)[:500], eos_bias=4.0)
    base = [f"paths.cache_dir={demo_cfg.paths.cache_dir}", "limit=2", "captioner.beam_width=3",
            "captioner.max_len=6"]
    ifcap = load_config("demo", base).resolved()
    hf = load_config("demo", [*base, "captioner.family=hf", f"captioner.hf.model={model}"]).resolved()
    models = load_models(ifcap)
    models.captioner = stage_registry.family("captioner").load(hf, None)
    rows = run_pipeline(read_records(hf)["test"], hf, models)
    assert all(r["error"] is None for r in rows), [r["error"] for r in rows]
    for r in rows:
        assert [c["beam_rank"] for c in r["candidates"]] == [0, 1, 2] and r["entities"] == []
        means = [c["lm_logprob_mean"] for c in r["candidates"]]
        assert means == sorted(means, reverse=True) and all(0 <= c["verifier"] <= 1 for c in r["candidates"])

    # identities: an IFCap config counts no other family's settings; the hf one counts its own, not IFCap's
    ids = config_identity(ifcap)["caption"]
    assert "captioner.checkpoint" in ids and not any(k.startswith(("captioner.hf", "captioner.candidates",
                                                                    "captioner.family")) for k in ids)
    other = load_config("demo", [*base, "captioner.hf.model=elsewhere", "captioner.candidates.lm=x"]).resolved()
    fp = search_corpus(ifcap.retrieval, ifcap.benchmark_cfg(), "demo", ifcap.paths.cache_dir).fingerprint
    assert stage_identities(other, fp) == stage_identities(ifcap, fp)
    hf_ids = config_identity(hf)["caption"]
    assert hf_ids["captioner.family"] == "hf" and "captioner.hf.model" in hf_ids and "captioner.checkpoint" not in hf_ids
    assert stage_identities(hf, fp)["caption"] != stage_identities(ifcap, fp)["caption"]

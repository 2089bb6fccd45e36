"""Conflicts the configuration shows are refused when it loads, and `adjcap fit --set` keeps a run's
config.toml in step with its heads/ (or refuses a setting that would change the features)."""

import json
import tomllib

import pytest
from typer.testing import CliRunner

from adjcap.config import ConfigError, load_config
from adjcap.engine.features import rows_to_table
from adjcap.engine.pipeline import run_pipeline
from adjcap.storage.rundir import RunDir
from adjcap.engine.run_plan import read_records
from adjcap.cli import app
from adjcap.jobs import extract_features


def test_a_learned_picker_with_the_training_free_protocol_is_refused_at_load():
    with pytest.raises(ConfigError) as e:
        load_config("demo", ["rerank.protocol=training-free"])
    msg = str(e.value)
    assert "\n" not in msg and "rerank.picker=ensemble" in msg and "rerank.protocol=training-free" in msg
    assert "fixed" in msg  # what to set instead
    assert load_config("demo", ["rerank.protocol=training-free", "rerank.picker=fixed"]).rerank.picker == "fixed"
    res = CliRunner().invoke(app, ["run-job", "demo", "--set", "rerank.protocol=training-free"])
    assert res.exit_code == 2 and "rerank.picker=ensemble" in res.output


@pytest.fixture(scope="module")
def run_with_features(demo_cfg, tmp_path_factory):
    """A run directory with demo features (in-process pipeline, 4 images per split) and its config."""
    cfg = load_config("demo", [f"paths.cache_dir={demo_cfg.paths.cache_dir}", "limit=4", "captioner.beam_width=4"])
    rcfg = cfg.resolved()
    run = RunDir(tmp_path_factory.mktemp("fitrun") / "run")
    records = read_records(rcfg)
    with run.lock():
        run.write_config(cfg.to_toml())
        extract_features.write_references(run, rcfg.benchmark, records)
        for split, recs in records.items():
            run.write_part(rcfg.benchmark, split, rows_to_table(run_pipeline(recs, rcfg)))
    return run


def _saved(run: RunDir) -> dict:
    return tomllib.loads(run.config_path.read_text())


def test_fit_with_another_protocol_writes_a_config_that_matches_its_heads(run_with_features):
    run = run_with_features
    assert _saved(run)["rerank"]["protocol"] == "inductive"
    res = CliRunner().invoke(app, ["fit", "--run", str(run.path), "--set", "rerank.protocol=transductive"])
    assert res.exit_code == 0, res.output
    meta = json.loads(run.heads_json_path.read_text())["meta"]
    saved = _saved(run)
    assert meta["protocol"] == saved["rerank"]["protocol"] == "transductive"
    assert meta["picker"] == saved["rerank"]["picker"]


def test_fit_refuses_a_setting_that_would_change_the_features(run_with_features):
    run = run_with_features
    before = run.config_path.read_text()
    res = CliRunner().invoke(app, ["fit", "--run", str(run.path), "--set", "captioner.beam_width=3",
                                   "--set", "rerank.protocol=inductive"])
    assert res.exit_code == 2
    assert "captioner.beam_width (4 -> 3)" in res.output and "run-job" in res.output
    assert run.config_path.read_text() == before

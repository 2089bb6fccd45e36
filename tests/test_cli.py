"""The command line: help everywhere, config printing and errors, evaluate on real caption data."""

import json
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from adjcap.cli import app

FIX = Path(__file__).parent / "fixtures" / "metrics"
runner = CliRunner()


@pytest.mark.parametrize("cmd", [[], ["config"], ["run-job"], ["encode-corpus"], ["fit"], ["evaluate"],
                                 ["report"], ["demo"], ["doctor"], ["caption"]])
def test_help_everywhere(cmd):
    res = runner.invoke(app, [*cmd, "--help"])
    assert res.exit_code == 0, res.output
    assert "Usage" in res.output


def test_commands_that_can_refuse_a_stale_run_dir_offer_fresh():
    """The refusal of a run directory made with other settings says "rerun with --fresh": every command
    that writes one must take it (`make demo` after an update that changed the demo world)."""
    for cmd in (["run-job"], ["demo"]):
        res = runner.invoke(app, [*cmd, "--help"], terminal_width=200)
        assert "--fresh" in res.output, (cmd, res.output)


def test_config_prints_resolved_toml_with_overrides():
    res = runner.invoke(app, ["config", "--preset", "ifcap", "--set", "verifier.enabled=true", "--set", "rerank.alpha=0.3"])
    assert res.exit_code == 0, res.output
    data = tomllib.loads(res.output)
    assert data["name"] == "ifcap" and data["verifier"]["enabled"] is True and data["rerank"]["alpha"] == 0.3
    assert data["retrieval"]["encoder"]["model"] == "RN50x64"


def test_config_list_names_every_preset():
    res = runner.invoke(app, ["config", "--list"])
    assert res.exit_code == 0
    for name in ("headline", "ifcap", "training-free", "transductive", "ablation-8", "verifier-flickr", "demo"):
        assert name in res.output


@pytest.mark.parametrize("args,needle", [
    (["config", "--set", "verifier.modell=x"], "verifier.modell"),
    (["config", "--set", "captioner.beam_width=-3"], "captioner.beam_width"),
    (["config", "--preset", "nope"], "unknown preset"),
])
def test_config_errors_name_the_key_and_exit_nonzero(args, needle):
    res = runner.invoke(app, args)
    assert res.exit_code != 0
    assert needle in res.output


def test_run_job_refuses_a_bad_override_before_doing_anything(tmp_path):
    res = runner.invoke(app, ["run-job", "demo", "--run-dir", str(tmp_path / "r"), "--set", "rerank.picker=best"])
    assert res.exit_code == 2 and "rerank.picker" in res.output
    assert not (tmp_path / "r").exists()


def test_evaluate_a_coco_results_file(tmp_path):
    out = tmp_path / "m.json"
    res = runner.invoke(app, ["evaluate", "--predictions", str(FIX / "viecap_coco_results_100.json"),
                              "--references", str(FIX / "coco_karpathy_test_gt_100.json"), "--format", "coco",
                              "--no-spice", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "CIDEr" in res.output
    m = json.loads(out.read_text())
    cider = m["metrics"]["CIDEr"]
    assert 20.0 < cider < 200.0  # a real captioner on COCO: CIDEr in the usual range, x100
    assert "CHAIR_s" in m["chair"]


def test_evaluate_reports_missing_reference_file(tmp_path):
    res = runner.invoke(app, ["evaluate", "--predictions", str(FIX / "viecap_coco_results_100.json"),
                              "--references", str(tmp_path / "nope.json"), "--no-spice"])
    assert res.exit_code != 0
    assert "nope.json" in res.output


def test_caption_of_a_missing_folder_is_one_line(tmp_path):
    res = runner.invoke(app, ["caption", str(tmp_path / "nope"), "--preset", "demo",
                              "--set", f"paths.cache_dir={tmp_path / 'cache'}"])
    assert res.exit_code == 2 and "not a directory" in res.output and len(res.output.strip().splitlines()) == 1

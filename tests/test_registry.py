""""Did you mean" on every name a user types, from the one helper in adjcap/registry.py."""

import ast
from pathlib import Path

import pytest
from typer.testing import CliRunner

from adjcap.config import ConfigError, load_config
from adjcap.registry import Registry, close_matches, lookup, unknown
from adjcap.cli import app

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def _error(args: list[str]) -> str:
    res = runner.invoke(app, args)
    assert res.exit_code != 0, res.output
    lines = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert lines, res.output
    return lines[0]


def test_unknown_names_one_line_with_close_matches_and_known_ones():
    msg = unknown("table", "ablaton", ["reproduction", "ablation", "chair"], see="adjcap reproduce --list")
    assert msg == ("unknown table 'ablaton'; did you mean 'ablation'? "
                   "(known: reproduction, ablation, chair; adjcap reproduce --list)")
    assert "did you mean" not in unknown("table", "zzz", ["ablation", "chair"])
    with pytest.raises(KeyError, match=r"unknown colour 'gren'; did you mean 'green'\?"):
        lookup({"red": 1, "green": 2}, "gren", "colour", KeyError)
    assert lookup({"red": 1}, "red", "colour") == 1


def test_close_matches_include_the_family_of_a_dashed_name():
    known = ["headline", "ifcap", "ifcap-nocaps", "ifcap-flickr30k", "demo"]
    assert close_matches("headlin", known) == ["headline"]
    assert set(close_matches("ifcap-coco-typo", known)) == {"ifcap", "ifcap-nocaps", "ifcap-flickr30k"}


def test_registry_get_suggests():
    reg: Registry[int] = Registry("thing")
    reg.add("alpha", 1)
    reg.add("beta", 2)
    with pytest.raises(ValueError, match=r"unknown thing 'alpah'; did you mean 'alpha'\? \(known: alpha, beta\)"):
        reg.get("alpah")


def test_preset_typos_suggest_the_preset():
    msg = _error(["config", "--preset", "headlin"])
    assert "unknown preset 'headlin'; did you mean 'headline'?" in msg
    msg = _error(["config", "--preset", "ifcap-coco-typo"])
    for near in ("'ifcap'", "'ifcap-nocaps'", "'ifcap-flickr30k'"):
        assert near in msg.split("(known:")[0]


@pytest.mark.parametrize("override,suggested", [
    ("ray.worker=2", "'ray.workers'"),
    ("rerank.trifuse.epoch=3", "'rerank.trifuse.epochs'"),
    ("benchmarks.coco.annotatons=x.json", "'benchmarks.coco.annotations'"),
    ("captioner.beam_widht=5", "'captioner.beam_width'"),
    ("verifier.chekpoint=x", "'captioner.checkpoint'"),  # the verifier has no checkpoint: the key that exists
    ("nme=x", "'name'"),
    ("rerank.protocol=inductiv", "'inductive'"),
    ("rerank.picker=ensembel", "'ensemble'"),
])
def test_set_key_and_value_typos_suggest(override, suggested):
    with pytest.raises(ConfigError) as e:
        load_config("demo", [override])
    assert "did you mean" in str(e.value) and suggested in str(e.value)
    assert suggested in _error(["config", "--preset", "demo", "--set", override])


def test_config_file_keys_suggest(tmp_path):
    p = tmp_path / "config.toml"
    p.write_text('base = "demo"\n[rerank]\nbta = 0.5\n')
    with pytest.raises(ConfigError, match=r"unknown config key 'rerank.bta'; did you mean 'rerank.beta'\?"):
        load_config(None, [], p)


def test_benchmark_table_protocol_and_prepare_typos_suggest():
    from adjcap.prepare import steps_of
    from adjcap.prepare.errors import PrepareError
    from adjcap.reproduce import get_table
    from adjcap.rerank.fitting import fit
    from adjcap.rerank.heads import HEADS
    from adjcap.report.tracking import TrackingError, parse_log_specs

    with pytest.raises(ConfigError, match=r"unknown benchmark 'cocoo'; did you mean 'coco'\?"):
        load_config("headline").benchmark_cfg("cocoo")
    with pytest.raises(ConfigError, match=r"unknown table 'ablaton'; did you mean 'ablation'\?"):
        get_table("ablaton")
    assert "did you mean 'ablation'?" in _error(["reproduce", "ablaton"])
    with pytest.raises(ValueError, match=r"unknown protocol 'transductiv'; did you mean 'transductive'"):
        fit(None, "transductiv")
    with pytest.raises(ValueError, match=r"did you mean 'trifuse'\?"):
        HEADS.get("trifus")
    with pytest.raises(PrepareError, match=r"unknown thing to prepare 'modles'; did you mean 'models'\?"):
        steps_of(["modles"])
    with pytest.raises(TrackingError, match=r"did you mean 'mlflow'\?"):
        parse_log_specs(["mlfow"])


def test_no_ad_hoc_close_match_lookups():
    """difflib is used in one place: the registry helper (everything else calls it)."""
    users = [p.relative_to(ROOT).as_posix() for pkg in ("adjcap", "actors", "jobs") for p in (ROOT / pkg).rglob("*.py")
             if "difflib" in {n.names[0].name for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.Import)}
             | {n.module for n in ast.walk(ast.parse(p.read_text())) if isinstance(n, ast.ImportFrom)}]
    assert users == ["adjcap/registry.py"], users

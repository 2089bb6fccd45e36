"""The cluster recipes in deploy/ against the schemas their tools publish: the Ray cluster launcher config
against the installed Ray's own ray/autoscaler/ray-schema.json, the Grafana dashboard's queries against
the metrics the job exports (actors.metrics; tests/test_dashboard_metrics.py checks those names on a
real scrape), and the container recipe against the pins and the wheel it installs."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import jsonschema
import pytest
import yaml

from adjcap.actors import metrics

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"


def _pins() -> dict[str, str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return {re.split(r"[\[=<>]", d)[0]: d for d in deps}


def test_cluster_launcher_config_passes_rays_schema():
    import ray.autoscaler

    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    cfg = yaml.safe_load((DEPLOY / "ray-cluster-aws-l4.yaml").read_text())
    jsonschema.validate(cfg, schema)
    # Ray's own check too, as `ray up` runs it: the provider's defaults filled in, then validated
    from ray.autoscaler._private.util import prepare_config, validate_config

    validate_config(prepare_config(cfg))
    workers = cfg["available_node_types"]["ray.worker.l4"]
    assert workers["node_config"]["InstanceType"].startswith("g6.")  # AWS's L4 instances
    assert workers["min_workers"] == 0 < workers["max_workers"]  # autoscaling from zero
    ray_pin = _pins()["ray"].split("==")[1].rstrip(".*")
    assert cfg["docker"]["image"].startswith(f"rayproject/ray:{ray_pin}")
    assert any("adjcap-*.whl" in c for c in cfg["setup_commands"])


def test_the_dashboard_queries_only_exported_metrics():
    dash = json.loads((DEPLOY / "grafana" / "adjcap.json").read_text())
    exported = metrics.prometheus_names()
    used: set[str] = set()
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        assert p["targets"] and p["datasource"]["uid"] == "${datasource}", p["title"]
        for t in p["targets"]:
            names = set(re.findall(r"\bray_adjcap_\w+", t["expr"]))
            assert names and names <= exported, (p["title"], names - exported)
            used |= names
    # every metric the job exports has a panel
    assert {n for n in exported if not n.endswith(("_sum", "_count"))} <= used | {
        f"ray_{metrics.BATCH_SECONDS}_bucket"}, exported - used
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            assert set(re.findall(r"\bray_adjcap_\w+", var["query"]["query"])) <= exported


def test_container_recipe_pins_ray_and_python_and_installs_the_wheel():
    text = (DEPLOY / "Dockerfile").read_text()
    base = re.search(r"^FROM (\S+)", text, re.M).group(1)
    ray_pin = _pins()["ray"].split("==")[1].rstrip(".*")
    assert re.fullmatch(rf"rayproject/ray:{re.escape(ray_pin)}\.\d+-py3\d+-gpu", base), base
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    wheel = f"adjcap-{version}-py3-none-any.whl"  # the name `pip wheel` gives this pure-Python package
    assert f"COPY dist/{wheel}" in text and f"pip install --no-cache-dir /tmp/{wheel}" in text
    health = re.search(r"^HEALTHCHECK .* CMD (\S+) (\S+)", text, re.M)
    assert health.groups() == ("adjcap", "doctor")
    eps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert "adjcap" in eps


@pytest.mark.parametrize("doc", ["ray-cluster-aws-l4.yaml", "Dockerfile"])
def test_recipes_run_commands_that_exist(doc):
    """Every `adjcap <command>` a recipe runs is a command of the CLI."""
    from adjcap.cli import app

    known = {c.name or c.callback.__name__.replace("_", "-") for c in app.registered_commands}
    command = r"(?:^\s*(?:-\s+)?|['\"]|&&\s*|CMD\s+|:\S+\s+)adjcap ([a-z][a-z-]+)"  # not prose
    used = set(re.findall(command, (DEPLOY / doc).read_text(), re.M))
    assert used and used <= known, used - known

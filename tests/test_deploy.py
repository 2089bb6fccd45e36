"""The cluster recipes in deploy/ against the schemas their tools publish: the Ray cluster launcher config
against the installed Ray's own ray/autoscaler/ray-schema.json, the Grafana dashboard's queries against
the metrics the job exports (actors.metrics; tests/test_dashboard_metrics.py checks those names on a
real scrape), and the container recipe against the pins and the wheel it installs.

The KubeRay manifests are checked against the field names and types of KubeRay's v1 API (ray.io/v1
RayCluster and RayJob, as KubeRay's API reference documents them) for the fields they use, written out
below: KubeRay's own CRD files are not installable from a package registry here (no PyPI or npm package
ships them), so a change of KubeRay's API is not caught by this test."""

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


def _map(values: dict) -> dict:
    return {"type": "object", "additionalProperties": values}


STR = {"type": "string"}
QUANTITY = {"anyOf": [{"type": "string"}, {"type": "integer"}]}
CONTAINER = {"type": "object", "required": ["name", "image"], "additionalProperties": False, "properties": {
    "name": STR, "image": STR,
    "env": {"type": "array", "items": {"type": "object", "required": ["name"], "additionalProperties": False,
                                       "properties": {"name": STR, "value": STR}}},
    "resources": {"type": "object", "additionalProperties": False,
                  "properties": {"requests": _map(QUANTITY), "limits": _map(QUANTITY)}},
    "ports": {"type": "array", "items": {"type": "object", "required": ["containerPort"], "additionalProperties": False,
                                         "properties": {"containerPort": {"type": "integer"}, "name": STR}}},
    "volumeMounts": {"type": "array", "items": {"type": "object", "required": ["name", "mountPath"],
                                                "additionalProperties": False,
                                                "properties": {"name": STR, "mountPath": STR}}}}}
POD_TEMPLATE = {"type": "object", "required": ["spec"], "additionalProperties": False, "properties": {
    "spec": {"type": "object", "required": ["containers"], "additionalProperties": False, "properties": {
        "containers": {"type": "array", "minItems": 1, "items": CONTAINER},
        "nodeSelector": _map(STR),
        "tolerations": {"type": "array", "items": {"type": "object", "additionalProperties": False, "properties": {
            "key": STR, "operator": {"enum": ["Exists", "Equal"]}, "value": STR,
            "effect": {"enum": ["NoSchedule", "PreferNoSchedule", "NoExecute"]}}}},
        "volumes": {"type": "array", "items": {"type": "object", "required": ["name"], "properties": {"name": STR}}}}}}}
RAY_START_PARAMS = _map(STR)  # KubeRay: map[string]string (a number there is refused by the API server)
METADATA = {"type": "object", "required": ["name"], "properties": {"name": STR, "labels": _map(STR)}}
KUBERAY_V1 = {
    "RayCluster": {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
                   "properties": {
        "apiVersion": {"const": "ray.io/v1"}, "kind": {"const": "RayCluster"}, "metadata": METADATA,
        "spec": {"type": "object", "required": ["headGroupSpec"], "additionalProperties": False, "properties": {
            "rayVersion": STR, "enableInTreeAutoscaling": {"type": "boolean"},
            "headGroupSpec": {"type": "object", "required": ["template"], "additionalProperties": False, "properties": {
                "rayStartParams": RAY_START_PARAMS, "template": POD_TEMPLATE}},
            "workerGroupSpecs": {"type": "array", "items": {
                "type": "object", "required": ["groupName", "template"], "additionalProperties": False, "properties": {
                    "groupName": STR, "replicas": {"type": "integer"}, "minReplicas": {"type": "integer"},
                    "maxReplicas": {"type": "integer"}, "rayStartParams": RAY_START_PARAMS, "template": POD_TEMPLATE}}}}}}},
    "RayJob": {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"], "additionalProperties": False,
               "properties": {
        "apiVersion": {"const": "ray.io/v1"}, "kind": {"const": "RayJob"}, "metadata": METADATA,
        "spec": {"type": "object", "required": ["entrypoint"], "additionalProperties": False, "properties": {
            "entrypoint": STR, "clusterSelector": _map(STR), "activeDeadlineSeconds": {"type": "integer"},
            "submissionMode": {"enum": ["K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode"]}}}}},
}
KUBERAY = sorted((DEPLOY / "kuberay").glob("*.yaml"))


@pytest.mark.parametrize("path", KUBERAY, ids=lambda p: p.name)
def test_kuberay_manifests_use_kuberays_v1_fields(path):
    doc = yaml.safe_load(path.read_text())
    jsonschema.validate(doc, KUBERAY_V1[doc["kind"]])
    ray_pin = _pins()["ray"].split("==")[1].rstrip(".*")
    if doc["kind"] == "RayCluster":
        assert doc["spec"]["rayVersion"].startswith(ray_pin)
        gpu = "amd.com/gpu" if "amd" in path.name else "nvidia.com/gpu"
        for group in doc["spec"]["workerGroupSpecs"]:
            (c,) = group["template"]["spec"]["containers"]
            assert c["resources"]["limits"][gpu] == c["resources"]["requests"][gpu]  # GPUs: requests = limits
            assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
    else:  # a RayJob names a RayCluster of this folder
        clusters = {yaml.safe_load(p.read_text())["metadata"]["name"] for p in KUBERAY if p.name.startswith("raycluster")}
        assert doc["spec"]["clusterSelector"]["ray.io/cluster"] in clusters


def test_kuberay_recipes_cover_nvidia_and_amd():
    kinds = {(yaml.safe_load(p.read_text())["kind"], "amd" in p.name) for p in KUBERAY}
    assert kinds == {("RayCluster", False), ("RayCluster", True), ("RayJob", False), ("RayJob", True)}
    bad = dict(yaml.safe_load((DEPLOY / "kuberay" / "raycluster-nvidia-l4.yaml").read_text()))
    bad["spec"]["workerGroupSpecs"][0]["rayStartParams"]["num-gpus"] = 1  # an int: KubeRay refuses it
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, KUBERAY_V1["RayCluster"])


@pytest.mark.parametrize("doc", ["ray-cluster-aws-l4.yaml", "Dockerfile",
                                 *(f"kuberay/{p.name}" for p in KUBERAY if p.name.startswith("rayjob"))])
def test_recipes_run_commands_that_exist(doc):
    """Every `adjcap <command>` a recipe runs is a command of the CLI."""
    from adjcap.cli import app

    known = {c.name or c.callback.__name__.replace("_", "-") for c in app.registered_commands}
    command = r"(?:^\s*(?:-\s+)?|['\"]|&&\s*|CMD\s+|:\S+\s+|entrypoint:\s+)adjcap ([a-z][a-z-]+)"  # not prose
    used = set(re.findall(command, (DEPLOY / doc).read_text(), re.M))
    assert used and used <= known, used - known

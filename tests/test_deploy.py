"""The cluster recipes in deploy/ against the schemas their tools publish and the behaviour they promise:
the Ray cluster launcher config against the installed Ray's own ray/autoscaler/ray-schema.json; the
KubeRay manifests against KubeRay v1.7.0's own CRD schemas (tests/fixtures/kuberay-v1.7.0, copied from
its release: README there), strict as `kubectl apply` is; the Grafana dashboard's queries against the
metrics the job exports (actors.metrics; tests/test_dashboard_metrics.py checks those names on a real
scrape); the container recipes (CUDA and ROCm) parsed for the pins, a JRE, no offline switch where
`prepare` runs and a health check of the install (run here against this environment), built only where
a docker daemon works; the MPS start script run against stand-ins of the driver's commands."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import jsonschema
import pytest
import yaml

from adjcap.actors import metrics

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
CRDS = Path(__file__).parent / "fixtures" / "kuberay-v1.7.0"
MOUNT = "/mnt/adjcap"  # the shared volume every recipe mounts
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]
IMAGE = f"registry.example.com/adjcap:{VERSION}"  # the placeholder a user replaces (docs/guide/cluster.md)


def _pins() -> dict[str, str]:
    deps = PYPROJECT["project"]["dependencies"]
    return {re.split(r"[\[=<>]", d)[0]: d for d in deps}


RAY_PIN = _pins()["ray"].split("==")[1].rstrip(".*")


def _aws() -> dict:
    return yaml.safe_load((DEPLOY / "ray-cluster-aws-l4.yaml").read_text())


def test_cluster_launcher_config_passes_rays_schema():
    import ray.autoscaler

    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    cfg = _aws()
    jsonschema.validate(cfg, schema)
    # Ray's own check too, as `ray up` runs it: the provider's defaults filled in, then validated
    from ray.autoscaler._private.util import prepare_config, validate_config

    validate_config(prepare_config(cfg))
    workers = cfg["available_node_types"]["ray.worker.l4"]
    assert workers["node_config"]["InstanceType"].startswith("g6.")  # AWS's L4 instances
    assert workers["min_workers"] == 0 < workers["max_workers"]  # autoscaling from zero


def test_cluster_launcher_runs_the_projects_image_on_a_cuda_13_driver():
    cfg = _aws()
    # every node boots AWS's current Base OSS NVIDIA driver DLAMI (driver >= 580: CUDA 13), never Ray's
    # `latest_dlami` (an Ubuntu 18.04 / CUDA 11 image in the pinned Ray)
    dlami = "resolve:ssm:/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-24.04/latest/ami-id"
    for name, node in cfg["available_node_types"].items():
        assert node["node_config"]["ImageId"] == dlami, name
    # the nodes run adjcap's own container (which holds torch): nothing is pip-installed on a node
    assert cfg["docker"]["image"] == IMAGE
    commands = [c for key in ("initialization_commands", "setup_commands", "head_setup_commands",
                              "worker_setup_commands", "head_start_ray_commands", "worker_start_ray_commands")
                for c in cfg.get(key) or []]
    assert not [c for c in commands if "pip install" in c or "pip3 install" in c]
    # the run directory, the cache, the data and the weights on the shared mount, inside the container
    opts = " ".join(cfg["docker"]["run_options"])
    assert f"-v {MOUNT}:{MOUNT}" in opts
    for var in ("ADJCAP_RUNS", "ADJCAP_CACHE", "ADJCAP_DATA", "HF_HOME"):
        assert re.search(rf"-e {var}={MOUNT}/\w+", opts), var
    # MPS on the GPU workers, before Ray starts (the split pools share each L4)
    start = cfg["worker_start_ray_commands"]
    assert start.index("adjcap-mps-start") < next(i for i, c in enumerate(start) if "ray start" in c)


def test_no_recipe_gates_prepare_on_doctor():
    """`adjcap doctor` exits 1 while anything is missing, so `doctor && prepare` never prepares."""
    docs = [*DEPLOY.rglob("*.yaml"), *DEPLOY.glob("Dockerfile*"), ROOT / "docs" / "guide" / "cluster.md"]
    for path in docs:
        text = path.read_text()
        assert not re.search(r"adjcap doctor[^\n]*&&[^\n]*adjcap prepare", text), path
        assert not re.search(r"adjcap doctor[^\n]*;[^\n]*adjcap prepare", text), path

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




DOCKERFILES = {"Dockerfile": "cuda", "Dockerfile.rocm": "hip"}


def _instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    lines, out, cur = path.read_text().splitlines(), [], ""
    for line in lines:
        if not cur and (not line.strip() or line.lstrip().startswith("#")):
            continue
        cur += line.rstrip("\\").strip() + " " if line.rstrip().endswith("\\") else line.strip()
        if not line.rstrip().endswith("\\"):
            word, _, rest = cur.partition(" ")
            out.append((word.upper(), rest.strip()))
            cur = ""
    return out


def _health(path: Path) -> str:
    (cmd,) = [args for word, args in _instructions(path) if word == "HEALTHCHECK"]
    return re.search(r"\bCMD\s+(.*)$", cmd).group(1)


@pytest.mark.parametrize("name", DOCKERFILES, ids=str)
def test_container_recipe_pins_ray_installs_java_and_the_wheel(name):
    path = DEPLOY / name
    ins = _instructions(path)
    (base,) = [args for word, args in ins if word == "FROM"]
    suffix = "-gpu" if DOCKERFILES[name] == "cuda" else ""
    assert re.fullmatch(rf"rayproject/ray:{re.escape(RAY_PIN)}\.\d+-py3\d+{suffix}", base), base
    runs = " ".join(args for word, args in ins if word == "RUN")
    # a JRE of Java 17 or newer for the PTB tokenizer, METEOR and SPICE
    jre = re.search(r"apt-get install [^&]*\bopenjdk-(\d+)-jre(?:-headless)?\b", runs)
    assert jre and int(jre.group(1)) >= 17, "no Java runtime installed"
    wheel = f"adjcap-{VERSION}-py3-none-any.whl"  # the name `pip wheel` gives this pure-Python package
    assert any(word == "COPY" and args.startswith(f"dist/{wheel}") for word, args in ins)
    assert f"pip install --no-cache-dir /tmp/{wheel}" in runs
    torch_pin = _pins()["torch"].split("==")[1]
    assert f"torch=={torch_pin}" in runs and "--index-url" in runs  # the pinned torch, from its build's index
    # the build fails unless the torch it installed is the build this image is for
    assert f"assert torch.version.{DOCKERFILES[name]}" in runs


@pytest.mark.parametrize("name", DOCKERFILES, ids=str)
def test_container_recipe_lets_prepare_download(name):
    """No offline switch baked into the image: `adjcap prepare` runs from it and must download."""
    ins = _instructions(DEPLOY / name)
    for word, args in ins:
        if word in ("ENV", "ARG", "RUN"):
            assert not re.search(r"\b(HF_HUB_OFFLINE|TRANSFORMERS_OFFLINE|HF_DATASETS_OFFLINE)\s*=\s*1", args), args
    env = " ".join(args for word, args in ins if word == "ENV")
    for var in ("ADJCAP_CACHE", "ADJCAP_DATA", "ADJCAP_RUNS", "HF_HOME"):  # all on the shared mount
        assert re.search(rf"\b{var}={MOUNT}/\w+", env), var


@pytest.mark.parametrize("name", DOCKERFILES, ids=str)
def test_container_health_check_is_the_install_not_the_prepared_data(name):
    """The health command checks the install (adjcap, Ray, the image's torch build, Java), not `adjcap
    doctor` (unhealthy until prepare has run)."""
    cmd = _health(DEPLOY / name)
    assert "doctor" not in cmd and "java -version" in cmd
    assert "import adjcap.cli, ray, torch" in cmd and f"assert torch.version.{DOCKERFILES[name]}" in cmd


@pytest.mark.slow
@pytest.mark.parametrize("name", DOCKERFILES, ids=str)
def test_container_health_check_runs_against_a_ready_install(name):
    """The health command run here, against this environment (a ready install: adjcap, Ray, a CUDA torch,
    Java; nothing prepared, no GPU): the CUDA image's command passes, the ROCm image's refuses this torch."""
    cmd = _health(DEPLOY / name)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    if not shutil.which("java", path=env["PATH"]):
        pytest.skip("no java on this machine: the health command cannot be run here")
    got = subprocess.run(["/bin/sh", "-c", cmd], env=env, capture_output=True, text=True, timeout=120)
    import torch

    this_build = "cuda" if torch.version.cuda else "hip" if getattr(torch.version, "hip", None) else "cpu"
    assert (got.returncode == 0) == (DOCKERFILES[name] == this_build), (cmd, got.stderr[-2000:])


def _docker_works() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.slow
@pytest.mark.parametrize("name", DOCKERFILES, ids=str)
def test_container_recipe_builds_and_is_healthy(name, tmp_path):
    if not _docker_works():
        pytest.skip("no working docker daemon here (`docker info` fails): the images are built only where one runs")
    dist = ROOT / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(dist), str(ROOT)], check=True)
    tag = f"adjcap-test:{VERSION}-{DOCKERFILES[name]}"
    subprocess.run(["docker", "build", "-f", str(DEPLOY / name), "-t", tag, str(ROOT)], check=True, timeout=3600)
    got = subprocess.run(["docker", "run", "--rm", tag, "/bin/sh", "-c", _health(DEPLOY / name)],
                         capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr[-2000:]


def _fake(bin_dir: Path, name: str, body: str) -> None:
    p = bin_dir / name
    p.write_text("#!/bin/sh\n" + body + "\n")
    p.chmod(0o755)


def test_mps_start_script_starts_the_daemon_once_and_never_blocks_ray(tmp_path):
    script = DEPLOY / "mps-start.sh"
    bin_dir, log = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    base = {"PATH": f"{bin_dir}:/usr/bin:/bin", "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "pipe"),
            "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "log")}

    def run(**env):
        got = subprocess.run(["/bin/sh", str(script)], env={**base, **env}, capture_output=True, text=True, timeout=30)
        assert got.returncode == 0, got.stderr  # never stops the `ray start` after it
        return got.stdout.strip()

    assert run().startswith("MPS: not started (no nvidia-cuda-mps-control")  # no NVIDIA driver here
    # stand-ins for the driver's commands: a GPU is listed; the control daemon is not running yet
    _fake(bin_dir, "nvidia-smi", 'echo "GPU 0: NVIDIA L4 (UUID: GPU-0)"')
    _fake(bin_dir, "nvidia-cuda-mps-control",
          f'echo "$@" >> {log}; if [ "$1" = "-d" ]; then touch {tmp_path}/up; exit 0; fi; '
          f'cat >/dev/null; [ -e {tmp_path}/up ]')
    assert run() == f"MPS: on (pipe directory {tmp_path / 'pipe'})"
    assert log.read_text().split() == ["-d"] and (tmp_path / "pipe").is_dir()
    assert run() == "MPS: already on"  # a second start (a restarted Ray) leaves the daemon as it is
    assert log.read_text().split() == ["-d"]
    assert run(ADJCAP_MPS="0") == "MPS: off (ADJCAP_MPS=0)"
    # a planted folder (here a link in place of the pipe folder) is refused, and nothing is started in it
    (tmp_path / "planted").symlink_to(tmp_path / "pipe", target_is_directory=True)
    line = run(CUDA_MPS_PIPE_DIRECTORY=str(tmp_path / "planted"))
    assert line.startswith(f"MPS: not started ({tmp_path / 'planted'} is a link or another user's folder"), line
    assert log.read_text().split() == ["-d"]
    # the images carry it where the recipes call it
    assert "COPY deploy/mps-start.sh /usr/local/bin/adjcap-mps-start" in (DEPLOY / "Dockerfile").read_text()



def _strict(schema):
    """A CRD's structural schema as `kubectl apply --validate=strict` applies it: unknown fields refused
    (objects with properties and no additionalProperties / preserve-unknown-fields), int-or-string as such."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: ({n: _strict(s) for n, s in v.items()} if k == "properties" else _strict(v))
           for k, v in schema.items() if not k.startswith("x-kubernetes-")}
    if schema.get("x-kubernetes-int-or-string"):
        return {"anyOf": [{"type": "integer"}, {"type": "string"}]}
    if (out.get("type") == "object" and "properties" in out and "additionalProperties" not in out
            and not schema.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


def _validator(schema: dict) -> jsonschema.protocols.Validator:
    return jsonschema.validators.validator_for(schema)(schema)  # built once: the CRDs are large


_SCHEMAS = {kind: _strict(json.loads((CRDS / f"{kind}.v1.schema.json").read_text())) for kind in ("RayCluster", "RayJob")}
CRD = {kind: _validator(s) for kind, s in _SCHEMAS.items()}
POD_TEMPLATE = _validator(_SCHEMAS["RayCluster"]["properties"]["spec"]["properties"]["headGroupSpec"]["properties"]["template"])
MANIFESTS = sorted((DEPLOY / "kuberay").glob("*.yaml"))


def _doc(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def _by_kind(kind: str) -> list[Path]:
    return [p for p in MANIFESTS if _doc(p)["kind"] == kind]


def _metadata_ok(meta: dict) -> None:
    assert isinstance(meta["name"], str) and set(meta) <= {"name", "labels", "annotations"}
    for key in ("labels", "annotations"):
        assert all(isinstance(v, str) for v in (meta.get(key) or {}).values()), key


def _containers(doc: dict) -> list[tuple[dict, dict]]:
    """(pod spec, container) of every pod a manifest makes."""
    spec = doc["spec"]
    templates = ([spec["headGroupSpec"]["template"], *(g["template"] for g in spec.get("workerGroupSpecs", []))]
                 if doc["kind"] == "RayCluster" else [spec["template"]] if doc["kind"] == "Job" else [])
    return [(t["spec"], c) for t in templates for c in t["spec"]["containers"]]


@pytest.mark.parametrize("path", _by_kind("RayCluster") + _by_kind("RayJob"), ids=lambda p: p.name)
def test_kuberay_manifests_pass_kuberays_own_crds(path):
    doc = _doc(path)
    assert doc["apiVersion"] == "ray.io/v1"
    CRD[doc["kind"]].validate(doc)
    _metadata_ok(doc["metadata"])
    if doc["kind"] == "RayCluster":
        assert doc["spec"]["rayVersion"].startswith(RAY_PIN)
        gpu = "amd.com/gpu" if "amd" in path.name else "nvidia.com/gpu"
        for group in doc["spec"]["workerGroupSpecs"]:
            (c,) = group["template"]["spec"]["containers"]
            assert c["resources"]["limits"][gpu] == c["resources"]["requests"][gpu]  # GPUs: requests = limits
            assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
    else:  # a RayJob names a RayCluster of this folder and keeps its runs on the shared volume
        clusters = {_doc(p)["metadata"]["name"] for p in _by_kind("RayCluster")}
        assert doc["spec"]["clusterSelector"]["ray.io/cluster"] in clusters
        assert f"--set paths.runs_dir={MOUNT}/runs" in doc["spec"]["entrypoint"]


def test_the_crd_check_refuses_what_kubernetes_refuses():
    good = _doc(DEPLOY / "kuberay" / "raycluster-nvidia-l4.yaml")
    CRD["RayCluster"].validate(good)
    bad = json.loads(json.dumps(good))
    bad["spec"]["workerGroupSpecs"][0]["rayStartParams"]["num-gpus"] = 1  # an int: KubeRay wants strings
    with pytest.raises(jsonschema.ValidationError):
        CRD["RayCluster"].validate(bad)
    bad = json.loads(json.dumps(good))
    bad["spec"]["workerGroupSpecs"][0]["minReplica"] = 0  # a misspelt field: strict validation refuses it
    with pytest.raises(jsonschema.ValidationError):
        CRD["RayCluster"].validate(bad)
    job = _doc(DEPLOY / "kuberay" / "rayjob-nvidia-l4.yaml")
    job["spec"]["resumeFrom"] = "last"  # no such RayJob field
    with pytest.raises(jsonschema.ValidationError):
        CRD["RayJob"].validate(job)


def test_kuberay_recipes_cover_nvidia_and_amd_and_define_the_shared_claim():
    kinds = {(_doc(p)["kind"], "amd" in p.name) for p in MANIFESTS if _doc(p)["kind"].startswith("Ray")}
    assert kinds == {("RayCluster", False), ("RayCluster", True), ("RayJob", False), ("RayJob", True)}
    (pvc,) = [_doc(p) for p in _by_kind("PersistentVolumeClaim")]
    assert pvc["apiVersion"] == "v1" and pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pvc["spec"]["storageClassName"] and pvc["spec"]["resources"]["requests"]["storage"]
    claims = {v["persistentVolumeClaim"]["claimName"] for p in MANIFESTS for spec, _ in _containers(_doc(p))
              for v in spec.get("volumes", []) if "persistentVolumeClaim" in v}
    assert claims == {pvc["metadata"]["name"]}  # every pod mounts the claim this folder defines
    text = (DEPLOY / "kuberay" / "pvc-adjcap-shared.yaml").read_text()
    for cls in ("efs-sc", "standard-rwx", "azurefile-csi", "rook-cephfs"):  # the classes to use, named
        assert cls in text


def test_prepare_job_is_a_valid_pod_on_the_shared_volume_and_downloads():
    (path,) = _by_kind("Job")
    doc = _doc(path)
    assert doc["apiVersion"] == "batch/v1" and doc["spec"]["backoffLimit"] >= 1
    assert set(doc["spec"]) <= {"backoffLimit", "template", "ttlSecondsAfterFinished", "activeDeadlineSeconds"}
    _metadata_ok(doc["metadata"])
    POD_TEMPLATE.validate(doc["spec"]["template"])  # the core pod schema KubeRay's CRD embeds
    ((spec, c),) = _containers(doc)
    assert spec["restartPolicy"] in ("Never", "OnFailure")
    line = " ".join(c["command"] + c["args"])
    assert re.search(r"adjcap prepare --for headline(?=\s*(&&|$))", line)  # prepare first, never behind doctor


@pytest.mark.parametrize("path", [p for p in MANIFESTS if _doc(p)["kind"] in ("RayCluster", "Job")],
                         ids=lambda p: p.name)
def test_kuberay_pods_run_the_users_image_with_everything_on_the_shared_volume(path):
    for spec, c in _containers(_doc(path)):
        want = IMAGE + ("-rocm" if "amd" in path.name else "")
        assert c["image"] == want, (c["name"], c["image"])  # a placeholder the user sets, not a bare local tag
        env = {e["name"]: e.get("value") for e in c.get("env", [])}
        assert "HF_HUB_OFFLINE" not in env and "TRANSFORMERS_OFFLINE" not in env  # prepare may run here
        mounts = {m["mountPath"] for m in c["volumeMounts"]}
        assert mounts == {MOUNT}
        for var in ("ADJCAP_RUNS", "ADJCAP_CACHE", "ADJCAP_DATA", "HF_HOME"):
            assert env[var].startswith(MOUNT + "/"), var


def test_l4_workers_start_mps_then_kuberays_ray_start():
    doc = _doc(DEPLOY / "kuberay" / "raycluster-nvidia-l4.yaml")
    assert doc["metadata"]["annotations"]["ray.io/overwrite-container-cmd"] == "true"
    for spec, c in _containers(doc):  # with the annotation, every container must run KubeRay's ray start itself
        assert c["command"] == ["/bin/bash", "-c", "--"]
        (args,) = c["args"]
        assert args.endswith('exec /bin/bash -c "$KUBERAY_GEN_RAY_START_CMD"'), c["name"]
        gpus = c["resources"]["limits"].get("nvidia.com/gpu")
        assert args.startswith("adjcap-mps-start;") == bool(gpus), c["name"]  # MPS where pools share a GPU


@pytest.mark.parametrize("doc", ["ray-cluster-aws-l4.yaml", "Dockerfile", "kuberay/job-prepare.yaml",
                                 *(f"kuberay/{p.name}" for p in _by_kind("RayJob"))])
def test_recipes_run_commands_that_exist(doc):
    """Every `adjcap <command>` a recipe runs is a command of the CLI."""
    from adjcap.cli import app

    known = {c.name or c.callback.__name__.replace("_", "-") for c in app.registered_commands}
    command = r"(?:^\s*(?:-\s+)?|['\"]|&&\s*|\{\s*|CMD\s+|:\S+\s+|entrypoint:\s+)adjcap ([a-z][a-z-]+)"  # not prose
    used = set(re.findall(command, (DEPLOY / doc).read_text(), re.M))
    assert used and used <= known, used - known

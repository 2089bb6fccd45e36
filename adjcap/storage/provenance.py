"""Provenance: what made a run. ``provenance.json`` (:class:`adjcap.storage.rundir.RunDir` owns its path) is
written when a job starts and completed when it ends: adjcap's version (and the git commit and dirty
flag when run from a checkout), Python and the key libraries' versions, Java, OS, CPU model and
instruction-set flags, GPUs (this node from torch; every node of a Ray cluster as the job gathered it),
start/end time (UTC), the command line, the resolved config's digest, every model's identity (tag or
content digest) and every dataset file's digest, and the stage identities of the features.

Everything here is cheap and never fails a run: what cannot be found is recorded as unknown, with why.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from adjcap.nested import flatten

if TYPE_CHECKING:
    from adjcap.config import Config
    from adjcap.engine.run_plan import RunPlan

# the libraries whose versions decide the numbers (distribution names)
KEY_LIBRARIES = (
    "torch", "torchvision", "ray", "open_clip_torch", "transformers", "tokenizers", "safetensors",
    "pycocoevalcap", "numpy", "pyarrow", "pillow", "nltk", "pydantic", "typer",
)
# the instruction-set flags that change float results or speed (from /proc/cpuinfo)
CPU_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
             "avx512_bf16", "amx_tile", "amx_bf16", "neon", "asimd", "sve")
SCHEMA = 1


def adjcap_version() -> str:
    try:
        return metadata.version("adjcap")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def library_versions(names: Sequence[str] = KEY_LIBRARIES) -> dict[str, str | None]:
    """distribution -> installed version (None when not installed)."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _source_root() -> Path:
    return Path(__file__).resolve().parents[2]


def git_info(root: Path | None = None) -> dict[str, Any] | None:
    """{"commit", "dirty"} when adjcap runs from a git checkout (None otherwise)."""
    root = root or _source_root()
    git = shutil.which("git")
    if git is None or not (root / ".git").exists():
        return None
    try:
        commit = subprocess.run([git, "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        status = subprocess.run([git, "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": bool(status.strip())}


def java_version(java: str = "java") -> str | None:
    """The first line of ``java -version`` (None when there is no Java)."""
    exe = shutil.which(java)
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    text = (out.stderr or out.stdout).strip()
    return text.splitlines()[0] if text else None


def cpu_info(cpuinfo: str | None = None) -> dict[str, Any]:
    """CPU model, logical cores and the instruction-set flags of :data:`CPU_FLAGS` it has."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            cpuinfo = ""
    model, flags = None, set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if model is None and key in ("model name", "hardware", "cpu model"):
            model = value.strip()
        elif not flags and key in ("flags", "features"):
            flags = set(value.split())
    return {"model": model or platform.processor() or None, "logical_cores": os.cpu_count(),
            "machine": platform.machine(), "flags": [f for f in CPU_FLAGS if f in flags]}


def gpu_info() -> dict[str, Any]:
    """This node's GPUs: count, names, driver. From ``nvidia-smi`` where there is one (no CUDA context
    is created in the calling process), else as torch sees them (AMD through ROCm)."""
    smi = _nvidia_smi()
    if smi is not None:
        return smi
    try:
        import torch
    except ImportError:
        return {"count": 0, "names": [], "driver": None}
    if not torch.cuda.is_available():
        return {"count": 0, "names": [], "driver": None}
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    hip = getattr(torch.version, "hip", None)
    driver = None
    p = Path("/sys/module/amdgpu/version")
    try:
        driver = f"amdgpu {p.read_text().strip()}" if p.exists() else None
    except OSError:
        pass
    return {"count": len(names), "names": names, "driver": driver,
            "runtime": f"ROCm {hip}" if hip else f"CUDA {torch.version.cuda}"}


def _nvidia_smi() -> dict[str, Any] | None:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    rows = [[x.strip() for x in line.split(",")] for line in out.stdout.strip().splitlines() if line.strip()]
    if out.returncode != 0 or not rows:
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return {"count": len(rows), "names": [r[0] for r in rows], "driver": rows[0][1] if len(rows[0]) > 1 else None,
            "memory": [r[2] for r in rows if len(r) > 2], "cuda_visible_devices": visible}


def os_info() -> dict[str, Any]:
    pretty = None
    try:
        for line in Path("/etc/os-release").read_text(encoding="utf-8").splitlines():
            if line.startswith("PRETTY_NAME="):
                pretty = line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return {"system": platform.system(), "release": platform.release(), "distribution": pretty}


def environment(java: str = "java") -> dict[str, Any]:
    """Versions and hardware of this process's node (cheap; no model is loaded)."""
    return {
        "adjcap": {"version": adjcap_version(), "git": git_info()},
        "python": {"version": platform.python_version(), "implementation": platform.python_implementation(),
                   "executable": sys.executable},
        "libraries": library_versions(),
        "java": java_version(java),
        "os": os_info(),
        "host": platform.node(),
        "cpu": cpu_info(),
        "gpu": gpu_info(),
    }


def version_text() -> str:
    """``adjcap --version``: adjcap's version (and commit) and the key libraries', one per line."""
    git = git_info()
    head = f"adjcap {adjcap_version()}"
    if git:
        head += f" (commit {git['commit'][:12]}{', dirty' if git['dirty'] else ''})"
    lines = [head, f"python {platform.python_version()}"]
    lines += [f"{name} {v or 'not installed'}" for name, v in library_versions().items()]
    return "\n".join(lines)


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


# --------------------------------------------------------------------------------------------
# what the config used: digest, models, data files
# --------------------------------------------------------------------------------------------


def config_digest(cfg: Config) -> str:
    """sha256 of the resolved config as TOML (the same config gives the same digest)."""
    return "sha256:" + hashlib.sha256(cfg.to_toml().encode("utf-8")).hexdigest()


# setting names that name a model or its files (tokenizer, vocabulary, ...); their values are tags/ids
# or paths, recorded by content (adjcap.engine.stage_cache.content_id)
MODEL_KEYS = ("model", "pretrained", "checkpoint", "tokenizer", "lm_config", "vocabulary", "tagger")


def model_identities(cfg: Config) -> dict[str, Any]:
    """Every model setting of the (resolved) config: a tag or hub id as is, a local file or folder by
    its content digest."""
    from adjcap.engine.stage_cache import content_id

    sections = {"retrieval": cfg.retrieval.model_dump(mode="json"),
                "verifier": cfg.verifier.model_dump(mode="json"),
                "captioner": cfg.captioner.model_dump(mode="json"),
                "scorer": cfg.scorer.model_dump(mode="json"),
                "eval": {"clipscore": cfg.eval.clipscore.model_dump(mode="json")}}
    out = {}
    for key, value in flatten(sections).items():
        if value is None or key.rsplit(".", 1)[-1] not in MODEL_KEYS:
            continue
        if key.startswith("verifier.") and not cfg.verifier.enabled:
            continue
        out[key] = content_id(value)
    return out


def data_digests(cfg: Config) -> dict[str, Any]:
    """The benchmark's annotation files and corpus by content (:func:`adjcap.storage.content_ids.file_content_id`)."""
    from adjcap.storage.content_ids import file_content_id

    out: dict[str, Any] = {}
    try:
        b = cfg.benchmark_cfg(cfg.benchmark)
    except Exception as e:  # noqa: BLE001 - provenance never fails a run
        return {"error": str(e)}
    files = {"annotations": b.annotations, "corpus": b.corpus,
             **{f"annotations.{s}": p for s, p in sorted(b.annotations_by_split.items())}}
    for name, path in files.items():
        if not path:
            continue
        p = Path(path)
        try:
            out[name] = {"path": str(p), "digest": file_content_id(p) if p.is_file() else None}
        except OSError as e:
            out[name] = {"path": str(p), "digest": None, "error": e.strerror or str(e)}
    out["images"] = {"root": b.images}
    return out


def feature_identities(plan: RunPlan) -> dict[str, Any]:
    """The corpus fingerprint, the retrieval index (location and digest) and each stage's identity, as
    resume and the stage cache key them: the run plan's, read once at the edge (the index's manifest
    digest is read here: it exists once the index is built)."""
    from adjcap.index.shards import MANIFEST
    from adjcap.storage.content_ids import file_content_id

    manifest = plan.index_path / MANIFEST  # written last; it holds every shard's sha256, so it stands for them all
    return {
        "corpus_fingerprint": plan.corpus.fingerprint,
        "corpus_captions": len(plan.corpus),
        "index": {"path": str(plan.index_path),
                  "digest": f"manifest:{file_content_id(manifest)}" if manifest.is_file() else None,
                  "identity": plan.index},
        "stages": dict(plan.stages),
    }


# --------------------------------------------------------------------------------------------
# the document
# --------------------------------------------------------------------------------------------


def start(plan: RunPlan, argv: Sequence[str] | None = None, job: str = "run-job") -> dict[str, Any]:
    """The provenance of a job as it starts (from its run plan); :func:`finish` completes it."""
    cfg = plan.cfg
    return {
        "schema": SCHEMA,
        "job": job,
        "status": "running",
        "started_utc": utc_now(),
        "finished_utc": None,
        "command": list(sys.argv if argv is None else argv),
        "cwd": os.getcwd(),
        **environment(cfg.eval.java),
        "config": {"name": cfg.name, "benchmark": cfg.benchmark, "digest": config_digest(cfg), "seed": cfg.seed},
        "models": model_identities(cfg),
        "data": data_digests(cfg),
        "features": feature_identities(plan),
        "cluster": None,
    }


def finish(doc: Mapping[str, Any], status: str = "finished") -> dict[str, Any]:
    """``doc`` with its end time and status (``finished`` or ``failed: ...``)."""
    out = dict(doc)
    out["finished_utc"] = utc_now()
    out["status"] = status
    try:
        t0 = datetime.fromisoformat(str(out["started_utc"]).replace("Z", "+00:00"))
        t1 = datetime.fromisoformat(out["finished_utc"].replace("Z", "+00:00"))
        out["seconds"] = round((t1 - t0).total_seconds(), 1)
    except (KeyError, ValueError):
        pass
    return out


def cluster_summary(nodes: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per-node facts a Ray job gathered (``{"host", "cpus", "gpus", "gpu_type", "memory_gib"}`` each)
    -> {"nodes", "gpus", "per_node"}."""
    per_node = [dict(n) for n in nodes]
    return {"nodes": len(per_node), "gpus": sum(int(n.get("gpus") or 0) for n in per_node), "per_node": per_node}


def short_lines(doc: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The few lines a report shows at its top: (label, text)."""
    if not doc:
        return []
    a = doc.get("adjcap") or {}
    git = a.get("git") or {}
    ver = f"adjcap {a.get('version', '?')}"
    if git:
        ver += f", commit {str(git.get('commit', ''))[:12]}{' (dirty)' if git.get('dirty') else ''}"
    libs = doc.get("libraries") or {}
    shown = ("torch", "ray", "open_clip_torch", "transformers", "pycocoevalcap", "numpy")
    lib_text = ", ".join(f"{n.replace('_torch', '')} {libs.get(n) or '-'}" for n in shown if n in libs)
    py = (doc.get("python") or {}).get("version", "?")
    cpu = doc.get("cpu") or {}
    gpu = doc.get("gpu") or {}
    cluster = doc.get("cluster") or {}
    hw = f"{cpu.get('model') or 'CPU ?'} ({', '.join(cpu.get('flags') or []) or 'no SIMD flags read'})"
    if cluster:
        types = sorted({str(n.get("gpu_type")) for n in cluster.get("per_node", []) if n.get("gpu_type")})
        hw += (f"; {cluster.get('nodes')} node(s), {cluster.get('gpus', 0)} GPU(s)"
               + (f" ({', '.join(types)})" if types else ""))
    if gpu.get("count"):
        hw += f"; this node: {gpu['count']} x {gpu['names'][0]}, driver {gpu.get('driver') or '?'}"
    elif not cluster:
        hw += "; no GPU"
    when = f"{doc.get('started_utc', '?')} -> {doc.get('finished_utc') or '(not finished)'}"
    if doc.get("seconds") is not None:
        when += f" ({doc['seconds']:.0f} s)"
    if doc.get("status") not in (None, "finished"):
        when += f", {doc['status']}"
    cfg = doc.get("config") or {}
    lines = [("version", f"{ver}; python {py}; {lib_text}; java: {doc.get('java') or 'none'}"),
             ("hardware", hw),
             ("when (UTC)", when),
             ("command", " ".join(str(x) for x in doc.get("command") or [])),
             ("config", f"{cfg.get('name', '?')} on {cfg.get('benchmark', '?')}, {cfg.get('digest', '?')}")]
    stages = (doc.get("features") or {}).get("stages")
    if stages:
        lines.append(("stage identities", ", ".join(f"{k} {v[:10]}" for k, v in stages.items())))
    return lines


def short_markdown(doc: Mapping[str, Any]) -> str:
    lines = short_lines(doc)
    if not lines:
        return ""
    body = "\n".join(f"- **{k}**: {v.replace('|', '/')}" for k, v in lines)
    return f"Provenance (provenance.json):\n\n{body}\n"


def short_html(doc: Mapping[str, Any]) -> str:
    import html

    lines = short_lines(doc)
    if not lines:
        return ""
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in lines)
    return f"<table class='provenance'><caption>Provenance (provenance.json)</caption>{rows}</table>"

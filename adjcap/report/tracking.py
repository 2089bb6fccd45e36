"""Experiment logging, opt-in (``--log mlflow[=TRACKING_URI]``, ``--log wandb[=PROJECT]``): a finished
run directory's resolved config as parameters, every metric per protocol and picker, the provenance as
tags, and the report, samples table and provenance as artifacts.

The trackers' libraries are imported only here and only when asked (extras ``adjcap[mlflow]``,
``adjcap[wandb]``); a missing one is a one-line error naming the extra.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adjcap.nested import flatten
from adjcap.registry import unknown
from adjcap.storage.rundir import RunDir

# the metrics logged per protocol and picker (x100 as in the report; CLIPScore w=2.5; CHAIR in %)
TAG_LIMIT = 5000  # characters of one tag value (MLflow allows 8000)


class TrackingError(ValueError):
    """A --log value that cannot be used; the message says what to do."""


@dataclass(frozen=True)
class Tracker:
    kind: str  # "mlflow" | "wandb"
    target: str | None  # MLflow tracking URI / W&B project


def parse_log_specs(specs: Sequence[str]) -> list[Tracker]:
    """``["mlflow", "mlflow=file:///x/mlruns", "wandb=my-project"]`` -> trackers (checked at once)."""
    out = []
    for spec in specs or ():
        kind, _, target = str(spec).partition("=")
        kind = kind.strip().lower()
        if kind not in LOGGERS:
            raise TrackingError(f"--log {spec}: {unknown('tracker', kind, LOGGERS)}; use mlflow[=TRACKING_URI] or wandb[=PROJECT]")
        out.append(Tracker(kind, target.strip() or None))
    return out


# --------------------------------------------------------------------------------------------
# what is logged
# --------------------------------------------------------------------------------------------


def run_params(run: RunDir) -> dict[str, str]:
    """The run's config (config.toml, as it re-runs), flattened, values as text."""
    import tomllib

    if not run.config_path.exists():
        return {}
    data = tomllib.loads(run.config_path.read_text(encoding="utf-8"))
    return {k: _text(v) for k, v in flatten(data, empty_is_leaf=False).items()}


def run_metrics(run: RunDir) -> dict[str, float]:
    """``<protocol>/<picker>/<metric>`` -> value for every number in metrics/<protocol>.json's
    pickers (COCO metrics, NoCaps domains, CLIPScore, CHAIR rates and counts). A protocol whose
    metrics are older than its predictions (refit, not yet evaluated) is left out."""
    out: dict[str, float] = {}
    for path in run.metrics_files():
        doc = json.loads(path.read_text(encoding="utf-8"))
        proto = doc.get("protocol", path.stem)
        if not run.metrics_current(proto):
            continue
        for picker, m in (doc.get("pickers") or {}).items():
            for k, v in (m.get("metrics") or {}).items():
                _put(out, f"{proto}/{picker}/{k}", v)
            for dom, scores in (m.get("domains") or {}).items():
                for k, v in scores.items():
                    _put(out, f"{proto}/{picker}/{dom}/{k}", v)
            cs = m.get("clipscore") or {}
            _put(out, f"{proto}/{picker}/CLIPScore", cs.get("CLIPScore"))
            ch = m.get("chair") or {}
            for k in ("CHAIR_s", "CHAIR_i", "n_mentioned", "n_hallucinated"):
                _put(out, f"{proto}/{picker}/{k}", ch.get(k))
            _put(out, f"{proto}/{picker}/n_images", m.get("n_images"))
    return out


def _put(out: dict[str, float], key: str, v: Any) -> None:
    if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v:
        out[key.replace(" ", "_")] = float(v)


def run_tags(run: RunDir) -> dict[str, str]:
    """The provenance, flattened to ``provenance.<key>`` text tags (long values cut)."""
    flat = flatten(run.provenance(), empty_is_leaf=False)
    return {f"provenance.{k}": _text(v)[:TAG_LIMIT] for k, v in flat.items()}


def run_artifacts(run: RunDir) -> list[Path]:
    paths = [run.report_md, run.report_html, run.samples_path, run.samples_card_path, run.provenance_path,
             run.config_path]
    return [p for p in paths if p.exists()]


def _text(v: Any) -> str:
    if isinstance(v, str):
        return v
    return json.dumps(v, ensure_ascii=False, default=str)


# --------------------------------------------------------------------------------------------
# the trackers
# --------------------------------------------------------------------------------------------


def _need(module: str, extra: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise TrackingError(f"--log {extra} needs the {module} package: pip install 'adjcap[{extra}]'") from None


def log_mlflow(run: RunDir, tracking_uri: str | None, name: str) -> str:
    """One MLflow run (experiment ``adjcap``); returns its run id."""
    import os

    mlflow = _need("mlflow", "mlflow")
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if uri and (uri.startswith("file:") or "://" not in uri):
        # a local folder named by the user: MLflow 3 keeps its file store but asks for this opt-in
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    if tracking_uri:
        mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_experiment("adjcap")
    with mlflow.start_run(run_name=name) as active:
        params = run_params(run)
        items = sorted(params.items())
        for i in range(0, len(items), 100):  # MLflow takes at most 100 params per batch
            mlflow.log_params(dict(items[i: i + 100]))
        metrics = run_metrics(run)
        if metrics:
            mlflow.log_metrics(metrics)
        mlflow.set_tags({**run_tags(run), "adjcap.run_dir": str(run.path.resolve())})
        for p in run_artifacts(run):
            mlflow.log_artifact(str(p))
        return active.info.run_id


def log_wandb(run: RunDir, project: str | None, name: str) -> str:
    """One W&B run (project ``adjcap`` by default; offline with WANDB_MODE=offline); returns its id.
    The provenance goes into the run's config under ``provenance`` and, in short, into its tags."""
    wandb = _need("wandb", "wandb")
    prov = run.provenance()
    git = ((prov.get("adjcap") or {}).get("git") or {})
    tags = [t[:64] for t in (f"adjcap-{(prov.get('adjcap') or {}).get('version', '?')}",
                             f"commit-{str(git.get('commit', ''))[:12]}" if git else "",
                             f"benchmark-{(prov.get('config') or {}).get('benchmark', '')}") if t]
    import os

    # W&B's files go to $WANDB_DIR/wandb, else into the run directory's wandb/ (offline: read them back there)
    w = wandb.init(project=project or "adjcap", name=name, dir=os.environ.get("WANDB_DIR") or str(run.path),
                   tags=tags, reinit="finish_previous",
                   config={"config": run_params(run), "provenance": run_tags(run)})
    try:
        metrics = run_metrics(run)
        if metrics:
            w.log(metrics)
            w.summary.update(metrics)
        art = wandb.Artifact(name=f"{_slug(name)}-outputs", type="adjcap-run")
        for p in run_artifacts(run):
            art.add_file(str(p), name=p.name)
        w.log_artifact(art)
        return w.id
    finally:
        w.finish()


def _slug(text: str) -> str:
    import re

    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "run"


LOGGERS: dict[str, Callable[[RunDir, str | None, str], str]] = {"mlflow": log_mlflow, "wandb": log_wandb}


def log_run(trackers: Sequence[Tracker], run: RunDir, name: str | None = None) -> dict[str, str]:
    """Log a finished run directory to every tracker; returns {tracker: run id}."""
    name = name or run.path.resolve().name
    out = {}
    for t in trackers:
        out[t.kind] = LOGGERS[t.kind](run, t.target, name)
        print(f"logged to {t.kind}" + (f" ({t.target})" if t.target else "") + f": run {out[t.kind]}")
    return out

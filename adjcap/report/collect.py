"""What a report reads from a run directory: config, metrics/<protocol>.json, heads/heads.json,
predictions and references (for the gallery)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adjcap.engine.captioners import describe
from adjcap.storage.rundir import RunDir

LM_PICKER = "lm"
# when the configured picker has no predictions in a protocol, the adjudicated caption is the
# first of these that has
PICKER_PREFERENCE = ("ensemble", "trifuse", "memattend", "fixed", "verifier", "retrieval")
PROTOCOL_ORDER = ("training-free", "inductive", "transductive")


@dataclass
class RunData:
    path: Path
    name: str
    config_name: str | None = None
    description: str = ""
    captioner: str = ""  # where the candidates came from, when not IFCap (adjcap.engine.captioners.describe)
    benchmark: str | None = None
    picker: str | None = None  # the configured headline picker (rerank.picker)
    protocol: str | None = None  # the configured protocol (rerank.protocol)
    apply_split: str = "test"
    image_root: Path | None = None
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)  # protocol -> metrics doc
    heads: dict[str, Any] | None = None
    # protocol -> {picker: why it could not run} (fit/<protocol>.json), e.g. verifier without a verifier
    not_applicable: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def protocols(self) -> list[str]:
        known = [p for p in PROTOCOL_ORDER if p in self.metrics]
        return known + sorted(p for p in self.metrics if p not in PROTOCOL_ORDER)

    def pickers(self, protocol: str) -> list[str]:
        names = list(self.metrics.get(protocol, {}).get("pickers", {}))
        order = [LM_PICKER, *PICKER_PREFERENCE]
        return [p for p in order if p in names] + sorted(p for p in names if p not in order)

    def adjudicated_picker(self, protocol: str) -> str | None:
        names = self.pickers(protocol)
        if self.picker in names and self.picker != LM_PICKER:
            return self.picker
        return next((p for p in PICKER_PREFERENCE if p in names), None)

    def headline(self) -> tuple[str, str] | None:
        """(protocol, picker) of the run's headline configuration, if it was evaluated."""
        protos = self.protocols
        if not protos:
            return None
        proto = self.protocol if self.protocol in protos else protos[0]
        if self.picker == LM_PICKER and LM_PICKER in self.pickers(proto):
            return proto, LM_PICKER  # a run configured to pick by the LM (IFCap): its headline is that pick
        picker = self.adjudicated_picker(proto) or (LM_PICKER if LM_PICKER in self.pickers(proto) else None)
        return (proto, picker) if picker else None

    def picker_metrics(self, protocol: str, picker: str) -> dict[str, Any]:
        return self.metrics.get(protocol, {}).get("pickers", {}).get(picker, {})

    def per_image(self, protocol: str, picker: str) -> dict[str, dict[str, Any]]:
        return self.metrics.get(protocol, {}).get("per_image", {}).get(picker, {})

    def predictions(self, protocol: str, picker: str) -> dict[str, str]:
        data = RunDir(self.path).predictions(protocol, picker)
        if isinstance(data, dict):
            data = data.get("annotations", [{"image_id": k, "caption": v} for k, v in data.items()])
        return {str(e["image_id"]): e["caption"] for e in data if isinstance(e, dict) and "caption" in e}

    def references(self) -> dict[str, list[str]]:
        run = RunDir(self.path)
        cands = [(b, s) for b, s in run.reference_splits() if s == self.apply_split]
        mine = [(b, s) for b, s in cands if b == self.benchmark]
        chosen = (mine or cands)[:1]
        return run.references(*chosen[0]) if chosen else {}


def load_run(path: str | Path) -> RunData:
    """Read what a report needs; a run without metrics/ gives an empty ``metrics``."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: not a run directory")
    rd = RunDir(path)
    run = RunData(path=path, name=path.name)
    if rd.config_path.exists():
        try:
            cfg = rd.config().resolved()  # read back here: the run's image root, its paths expanded
            run.config_name = cfg.name
            run.description = cfg.description
            run.captioner = describe(cfg)
            run.benchmark = cfg.benchmark
            run.picker = cfg.rerank.picker
            run.protocol = cfg.rerank.protocol
            run.apply_split = cfg.rerank.apply_split
            if cfg.benchmark in cfg.benchmarks:
                run.image_root = Path(cfg.benchmarks[cfg.benchmark].images)
        except Exception as e:  # noqa: BLE001 - the report still renders what it can
            run.description = f"(config.toml could not be read: {e})"
    run.metrics.update(rd.metrics_docs())
    for proto in run.metrics:
        na = rd.fit_summary(proto).get("not_applicable") or {}
        if isinstance(na, dict):
            run.not_applicable[proto] = {str(k): str(v) for k, v in na.items()}
    hfile = rd.heads_json_path
    if hfile.exists():
        try:
            run.heads = json.loads(hfile.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            run.heads = {"error": f"{hfile} is not valid JSON"}
    return run

"""Evaluation engine: score prediction sets against a reference set, print metric tables.

* :func:`evaluate_predictions` - the engine behind ``adjcap evaluate --predictions PRED.json
  --references REFS``: any COCO results list ``[{"image_id", "caption"}]`` (image_id = numeric
  COCO id or file name) against any reference layout ``adjcap.data.benchmarks`` reads.
* :func:`format_table` - a result as a plain-text table.

A run directory's predictions are scored with this engine by :mod:`adjcap.metrics.run_metrics`.
* :class:`Evaluator` - many prediction sets against one reference set, sharing the reference
  tokenisation and one METEOR process.
"""

from __future__ import annotations

import json
import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from adjcap.data.domains import normalize_domain
from adjcap.storage.io import atomic_write_json
from adjcap.metrics.chair import ChairMatcher, chair, load_instance_objects
from adjcap.metrics.coco import (
    METRIC_NAMES,
    MetricResult,
    OnMissing,
    attach_spice,
    spice_per_image,
    align,
    score_tokenized,
)
from adjcap.java.runtime import MetricError
from adjcap.metrics.meteor import MeteorScorer, try_shared_meteor
from adjcap.metrics.spice import SpiceConfig
from adjcap.metrics.tokenizer import ptb_tokenize

DOMAIN_ORDER = ("in-domain", "near-domain", "out-domain")


# ---------------------------------------------------------------------------------------------
# many prediction sets, one reference set
# ---------------------------------------------------------------------------------------------


class Evaluator:
    """Score prediction dicts {image_id: caption} against fixed references.

    References are PTB-tokenised once; prediction captions are tokenised once per distinct text;
    the process-wide METEOR process serves every call. Use as a context manager.
    """

    def __init__(
        self,
        references: Mapping[Hashable, Sequence[str]],
        domains: Mapping[Hashable, str] | None = None,
        *,
        spice: SpiceConfig | None = None,
        java: str = "java",
        tmp_dir: str | Path | None = None,
        on_missing: OnMissing = "error",
        chair: bool = True,
        instance_objects: Mapping[Hashable, set[str]] | None = None,
        chair_ground_truth: str = "proxy",
    ):
        self.references = {k: list(v) for k, v in references.items()}
        self.domains = {k: normalize_domain(v) or v for k, v in domains.items() if v} if domains else None
        self.spice = spice
        self.java = java
        self.tmp_dir = tmp_dir
        self.on_missing = on_missing
        self.chair = ChairMatcher() if chair else None
        # eval.chair: "proxy", "instances" or "both"; instance CHAIR needs every image's COCO objects
        self.chair_ground_truth = chair_ground_truth
        self.instance_objects = instance_objects
        self._ref_tok: dict[Hashable, list[str]] | None = None
        self._cap_tok: dict[str, str] = {}
        self._spice_scores: dict[tuple[Hashable, str], float] = {}
        self._spice_failed: str | None = None

    # ---- shared state ------------------------------------------------------------------------
    def _refs_tokenized(self) -> dict[Hashable, list[str]]:
        if self._ref_tok is None:
            self.tokenize_ahead(())
        return self._ref_tok

    def tokenize_ahead(self, captions: Iterable[str]) -> None:
        """PTB-tokenise ``captions`` not tokenised yet, with the references when they are not yet: one
        Java process for all of them (a caller scoring many prediction sets hands every caption here
        first, e.g. each picker's and each seed's picks of a run). Each line is tokenised on its own
        (``-preserveLines``), so the tokens are those of one call per set."""
        new = sorted({c for c in captions if c not in self._cap_tok})
        batch: dict[Hashable, list[str]] = {("caption", k): [c] for k, c in enumerate(new)}
        if self._ref_tok is None:
            batch.update({("reference", k): v for k, v in self.references.items()})
        tok = ptb_tokenize(batch, java=self.java, tmp_dir=self.tmp_dir) if batch else {}
        for k, c in enumerate(new):
            self._cap_tok[c] = tok[("caption", k)][0]
        if self._ref_tok is None:
            self._ref_tok = {k: tok[("reference", k)] for k in self.references}

    def _spice(
        self, preds: Mapping[Hashable, str], refs: Mapping[Hashable, Sequence[str]]
    ) -> tuple[dict[Hashable, float] | None, str | None]:
        """Per-image SPICE, computed once per (image, caption): a picker that agrees with another
        on an image reuses its score. An unavailable SPICE is not retried (no repeated downloads)."""
        if self.spice is None:
            return None, "not requested"
        if self._spice_failed is not None:
            return None, self._spice_failed
        todo = {i: c for i, c in preds.items() if (i, c) not in self._spice_scores}
        if todo:
            per, reason = spice_per_image(todo, {i: refs[i] for i in todo}, self.spice)
            if per is None:
                self._spice_failed = reason
                return None, reason
            for i, v in per.items():
                self._spice_scores[(i, todo[i])] = v
        return {i: self._spice_scores[(i, c)] for i, c in preds.items()}, None

    def _meteor_proc(self) -> MeteorScorer | None:
        """The shared METEOR process, or None when it cannot start (METEOR is then reported
        missing with the reason; the other metrics are not lost)."""
        return try_shared_meteor(self.java)

    def close(self) -> None:
        """Drop the caches (the METEOR process is shared and stays up for later evaluations)."""
        self._ref_tok = None
        self._cap_tok.clear()

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- scoring -------------------------------------------------------------------------------
    def score(self, predictions: Mapping[Hashable, str], *, on_missing: OnMissing | None = None) -> dict[str, Any]:
        """-> {"n_images", "metrics" (x100), "domains" (NoCaps: each domain + overall), "chair",
        "notes", "per_image" {id: {metric: x100}}}."""
        preds, refs, notes = align(predictions, self.references, on_missing or self.on_missing)
        self._meteor_proc()  # starts the JVM (if not up) while the captions are tokenised
        self.tokenize_ahead(preds.values())  # with the references on the first call: one Java process
        gts_all = self._refs_tokenized()
        ids = list(preds)
        gts = {i: gts_all[i] for i in ids}
        res = {i: [self._cap_tok[preds[i]]] for i in ids}
        met = self._meteor_proc()
        overall = score_tokenized(gts, res, meteor=met)
        overall.notes.update(notes)
        parts: dict[str, MetricResult] = {}
        if self.domains is not None:
            missing = [i for i in ids if i not in self.domains]
            if missing:
                raise MetricError(
                    f"{len(missing)} images have no NoCaps domain label, e.g. {missing[:5]}; "
                    "the references must carry in/near/out-domain labels"
                )
            by_dom: dict[str, list[Hashable]] = {}
            for i in ids:
                by_dom.setdefault(self.domains[i], []).append(i)
            names = [d for d in DOMAIN_ORDER if d in by_dom] + sorted(d for d in by_dom if d not in DOMAIN_ORDER)
            for d in names:
                sub = by_dom[d]
                parts[d] = score_tokenized({i: gts[i] for i in sub}, {i: res[i] for i in sub}, meteor=met)
        spice_per, reason = self._spice(preds, refs)
        for r in [overall, *parts.values()]:
            attach_spice(r, spice_per, reason)
        out: dict[str, Any] = {
            "n_images": overall.n_images,
            "metrics": overall.to_dict(per_image=False)["scores"],
            "notes": overall.notes,
        }
        if parts:
            out["domains"] = {d: r.to_dict(per_image=False)["scores"] | {"n_images": r.n_images} for d, r in parts.items()}
            out["domains"]["overall"] = dict(out["metrics"]) | {"n_images": overall.n_images}
        out["per_image"] = overall.to_dict(per_image=True)["per_image"]
        words = [len(str(c).split()) for c in preds.values()]
        out["length"] = {"mean_words": sum(words) / len(words) if words else 0.0}
        for i, c in preds.items():
            out["per_image"].setdefault(str(i), {})["words"] = len(str(c).split())
        if self.chair is not None:
            instances = self.instance_objects is not None and self.chair_ground_truth in ("instances", "both")
            first = (chair(preds, refs, objects=self.instance_objects, matcher=self.chair)
                     if instances and self.chair_ground_truth == "instances" else chair(preds, refs, matcher=self.chair))
            out["chair"] = first.to_dict()
            for i, d in first.per_image.items():  # counts, so CHAIR_i can be bootstrapped over images
                row = out["per_image"].setdefault(str(i), {})
                row["CHAIR_mentioned"] = len(d["mentioned"])
                row["CHAIR_hallucinated"] = len(d["hallucinated"])
                row["CHAIR_objects"] = len(d["objects"])
                row["CHAIR_recalled"] = len(set(d["objects"]) & set(d["mentioned"]))
            if instances and self.chair_ground_truth == "both":
                out["chair_instances"] = chair(preds, refs, objects=self.instance_objects, matcher=self.chair).to_dict()
            inst = out.get("chair_instances") or (out["chair"] if self.chair_ground_truth == "instances" else {})
            if inst.get("n_without_instances"):
                out["notes"]["chair_instances_absent"] = (
                    f"{inst['n_without_instances']} of {inst['n_captions']} images are in no instances file: scored "
                    "against their references alone, as the original CHAIR scores them")
        return out


# ---------------------------------------------------------------------------------------------
# prediction files
# ---------------------------------------------------------------------------------------------


def load_predictions(src: str | Path | Sequence[Mapping[str, Any]] | Mapping[str, Any]) -> list[dict[str, Any]]:
    """A COCO results list ``[{"image_id", "caption", ...}]`` from a path or in memory.

    Also accepted: ``{"annotations": [...]}`` and a plain ``{image_id: caption}`` mapping.
    """
    where = "predictions"
    if isinstance(src, (str, Path)):
        p = Path(src).expanduser()
        where = str(p)
        if not p.exists():
            raise FileNotFoundError(f"{p}: predictions file not found")
        try:
            obj: Any = json.loads(p.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ValueError(f"{p}: not valid JSON ({e}); expected a COCO results list [{{image_id, caption}}]") from None
    else:
        obj = src
    if isinstance(obj, Mapping) and "annotations" in obj:
        obj = obj["annotations"]
    if isinstance(obj, Mapping):
        obj = [{"image_id": k, "caption": v} for k, v in obj.items()]
    if not isinstance(obj, Sequence) or isinstance(obj, (str, bytes)):
        raise ValueError(f"{where}: expected a COCO results list [{{\"image_id\": ..., \"caption\": ...}}]")
    bad: list[int] = []
    out: list[dict[str, Any]] = []
    for k, e in enumerate(obj):
        if not isinstance(e, Mapping) or "image_id" not in e or not isinstance(e.get("caption"), str):
            bad.append(k)
            continue
        out.append(dict(e))
    if bad:
        raise ValueError(
            f"{where}: {len(bad)} entries are not {{\"image_id\", \"caption\": str}} (entries {bad[:5]}); "
            "expected a COCO results list"
        )
    if not out:
        raise ValueError(f"{where}: no predictions")
    return out


def resolve_predictions(
    entries: Sequence[Mapping[str, Any]],
    resolve: Any,
    *,
    on_missing: OnMissing = "error",
    source: str = "predictions",
) -> tuple[dict[str, str], dict[str, Mapping[str, Any]], list[Any]]:
    """Map each entry's image_id to a canonical reference id with ``resolve(id) -> id | None``.

    Returns ({canonical id: caption}, {canonical id: entry}, unresolved ids). Duplicate images are
    an error (pycocoevalcap scores one caption per image); unresolved ids are an error unless
    ``on_missing="intersection"``.
    """
    preds: dict[str, str] = {}
    rows: dict[str, Mapping[str, Any]] = {}
    unresolved: list[Any] = []
    dup: list[Any] = []
    for e in entries:
        cid = resolve(e["image_id"])
        if cid is None:
            unresolved.append(e["image_id"])
            continue
        if cid in preds:
            dup.append(e["image_id"])
            continue
        preds[cid] = e["caption"]
        rows[cid] = e
    if dup:
        raise ValueError(
            f"{source}: {len(dup)} images have more than one caption (e.g. {dup[:5]}); keep one per image"
        )
    if unresolved and on_missing == "error":
        raise MetricError(
            f"{source}: {len(unresolved)} of {len(entries)} predicted image ids match no reference image "
            f"(e.g. {unresolved[:5]}). Use the references' ids (numeric COCO ids or file names), check "
            "--format/--split, or pass --intersection to score only the matching images."
        )
    return preds, rows, unresolved


def spice_from(spice_cfg: Any, work_dir: Path | None, cache_dir: str | Path | None = None) -> SpiceConfig | None:
    """SpiceConfig from: None/False (no SPICE), a SpiceConfig, or an EvalCfg-like object."""
    if spice_cfg is None or spice_cfg is False:
        return None
    if isinstance(spice_cfg, SpiceConfig):
        return spice_cfg
    if not getattr(spice_cfg, "spice", True):
        return None
    # no run directory: SPICE keeps its parse cache in the private $ADJCAP_CACHE/spice (never a shared path)
    return SpiceConfig.from_eval_cfg(spice_cfg, work_dir, cache_dir=cache_dir)


def instance_objects_for(references: Mapping[str, Any], coco: Mapping[str, int], ground_truth: str,
                         files: Sequence[str | Path]) -> tuple[dict[str, set[str]] | None, str | None]:
    """:func:`adjcap.metrics.run_metrics.instance_ground_truth` for references whose COCO ids are ``coco`` ({image id: COCO id})."""
    if ground_truth == "proxy":
        return None, None
    absent = [i for i in references if str(i) not in coco]
    if absent:
        return None, (f"instance CHAIR not available: {len(absent)} of {len(references)} images have no COCO id "
                      "(only COCO images have instance annotations); CHAIR is the reference proxy")
    return load_instance_objects(list(files), {str(i): coco[str(i)] for i in references}), None


def evaluate_predictions(
    pred_path_or_list: str | Path | Sequence[Mapping[str, Any]],
    refs_path: str | Path,
    fmt: str = "auto",
    split: str | None = None,
    spice_cfg: Any = None,
    out: str | Path | None = None,
    *,
    on_missing: OnMissing = "error",
    java: str = "java",
    tmp_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Score a COCO results list against a reference file; write JSON to ``out`` if given.

    ``spice_cfg``: None (no SPICE), a :class:`SpiceConfig`, or ``Config.eval``. The returned dict
    holds every metric (x100), ``domains`` for NoCaps (each domain as its own corpus, plus
    ``overall``), the CHAIR proxy, notes (why a metric is missing) and per-image scores.
    """
    from adjcap.data.references import read_references

    refs = read_references(refs_path, fmt=fmt, split=split)
    entries = load_predictions(pred_path_or_list)
    src = str(pred_path_or_list) if isinstance(pred_path_or_list, (str, Path)) else "predictions"
    preds, _, unresolved = resolve_predictions(entries, refs.resolve, on_missing=on_missing, source=src)
    if not preds:
        raise MetricError(f"{src}: no predicted image id matches the references in {refs_path}")
    # eval.chair of ``spice_cfg`` (Config.eval): the instances files checked before any metric runs
    ground_truth = getattr(spice_cfg, "chair", "proxy") if spice_cfg is not None else "proxy"
    objects, chair_note = instance_objects_for(refs.captions, refs.coco_ids, ground_truth,
                                               getattr(spice_cfg, "coco_instances", ()))
    # SPICE's parse cache: tmp_dir if given, else the private $ADJCAP_CACHE/spice
    spice = spice_from(spice_cfg, Path(tmp_dir) if tmp_dir is not None else None)
    with Evaluator(refs.captions, refs.domains, spice=spice, java=java, tmp_dir=tmp_dir, on_missing=on_missing,
                   instance_objects=objects, chair_ground_truth=ground_truth) as ev:
        result = ev.score(preds)
    if chair_note:
        result["notes"]["chair_instances"] = chair_note
    if unresolved:
        result["notes"]["unresolved_predictions"] = (
            f"{len(unresolved)} predictions matched no reference image and were not scored"
        )
    report: dict[str, Any] = {
        "predictions": src,
        "references": str(refs_path),
        "format": refs.fmt or fmt,
        "split": split,
        **result,
    }
    if out is not None:
        atomic_write_json(out, report)
    return report


# ---------------------------------------------------------------------------------------------
# printing
# ---------------------------------------------------------------------------------------------


def _fmt(v: Any, digits: int = 1) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    return f"{float(v):.{digits}f}"


def format_table(metrics: Mapping[str, Any], digits: int = 1) -> str:
    """A plain-text table of an :func:`evaluate_predictions` / :meth:`Evaluator.score` result (or of
    a bare {metric: value} dict): one row per corpus (NoCaps: each domain and overall), then CHAIR."""
    if "metrics" in metrics or "domains" in metrics:
        rows = dict(metrics["domains"]) if metrics.get("domains") else {"all": metrics["metrics"]}
    else:
        rows = {"all": metrics}
    cols = list(METRIC_NAMES)
    w0 = max(len("corpus"), *(len(k) for k in rows))
    widths = [max(len(c), 5) for c in cols]
    lines = [
        "  ".join(["corpus".ljust(w0)] + [c.rjust(w) for c, w in zip(cols, widths)] + ["images".rjust(6)]),
    ]
    n_all = metrics.get("n_images")
    for name, sc in rows.items():
        n = sc.get("n_images", n_all) if isinstance(sc, Mapping) else None
        lines.append(
            "  ".join(
                [name.ljust(w0)]
                + [_fmt(sc.get(c), digits).rjust(w) for c, w in zip(cols, widths)]
                + [str(n if n is not None else "").rjust(6)]
            )
        )
    ch = metrics.get("chair")
    if ch:
        lines.append(
            f"CHAIR proxy: CHAIR_s {ch['CHAIR_s']:.2f}%  CHAIR_i {ch['CHAIR_i']:.2f}%  "
            f"objects mentioned {ch['n_mentioned']}  hallucinated {ch['n_hallucinated']}"
        )
    cs = metrics.get("clipscore")
    if cs and cs.get("CLIPScore") is not None:
        lines.append(f"CLIPScore (w=2.5): {cs['CLIPScore']:.4f} over {cs['n_images']} images")
    for k, v in (metrics.get("notes") or {}).items():
        lines.append(f"note [{k}]: {v}")
    return "\n".join(lines)

"""A run directory's metrics: :func:`evaluate_run` scores every ``predictions/<protocol>/<picker>.json``
of a run with the evaluation engine (:mod:`adjcap.metrics.evaluate`) and writes
``metrics/<protocol>.json`` (COCO metrics, NoCaps domains, CHAIR, CLIPScore from the feature table,
rank statistics; with ``predictions/<protocol>/seeds/``, the seed study of :mod:`adjcap.metrics.seeds`
under ``seeds``). Images whose feature row has an error are counted, not scored.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from adjcap.metrics.clipscore import CLIPSCORE_W, clipscore_from_features
from adjcap.java.runtime import MetricError
from adjcap.metrics.coco import OnMissing
from adjcap.metrics.evaluate import Evaluator, instance_objects_for, load_predictions, resolve_predictions, spice_from
from adjcap.metrics.ranks import pick_disagreement, retrieval_verifier_spearman, top1_agreement
from adjcap.metrics.seeds import BASELINES, seed_study
from adjcap.storage.rundir import RunDir

LM_PICKER = "lm"
HEAD_PICKERS = ("trifuse", "memattend")


def load_run_references(run_dir: str | Path | RunDir) -> tuple[dict[str, list[str]], dict[str, str] | None, Any]:
    """The references, domains and apply-split feature table a run directory holds (see RunDir)."""
    run = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    bench, split = run.settings()
    cands = [(b, s) for b, s in run.reference_splits() if s == split and (bench is None or b == bench)]
    if len(cands) != 1 and bench is not None:
        cands = [(b, s) for b, s in run.reference_splits() if s == split]
    if len(cands) != 1:
        raise FileNotFoundError(
            f"{run.path / 'references'}: cannot tell which references to score against "
            f"(found {[f'{b}-{s}' for b, s in cands]}); pass references= explicitly"
        )
    b, s = cands[0]
    # only the run's current image set (a rerun with a smaller --limit keeps the other rows on disk)
    feats = run.read_features(b, s, image_ids=run.current_ids(b, s)) if run.has_features(b, s) else None
    return run.references(b, s), run.domains(b, s), feats


def instance_ground_truth(run: RunDir, references: Mapping[str, Any], ground_truth: str,
                          files: Sequence[str | Path]) -> tuple[dict[str, set[str]] | None, str | None]:
    """(each image's COCO instance classes, None) for ``eval.chair = instances | both``; (None, a note)
    when the run's images have no COCO ids (NoCaps, Flickr30k, a folder: no instance annotations), and
    (None, None) for the proxy. A missing instances file is a one-line error naming it."""
    if ground_truth == "proxy":
        return None, None
    coco: dict[str, int] = {}
    for b, s in run.reference_splits():
        coco.update(run.coco_ids(b, s))
    return instance_objects_for(references, coco, ground_truth, files)


def failed_image_ids(features: Any, references: Mapping[str, Any]) -> set[str]:
    """Ids of the referenced images whose feature row carries an error (decode, a stage failure)."""
    if features is None:
        return set()
    rows = features.select(["image_id", "error"]).to_pylist() if hasattr(features, "select") else features
    return {str(r["image_id"]) for r in rows if r.get("error") and str(r["image_id"]) in references}


def _pick_key(entry: Mapping[str, Any]) -> Any:
    ci = entry.get("candidate_index")
    if isinstance(ci, int) and not isinstance(ci, bool) and ci >= 0:
        return ci
    return entry["caption"].strip()


def evaluate_run(
    run_dir: str | Path,
    references: Mapping[str, Sequence[str]] | None = None,
    domains: Mapping[str, str] | None = None,
    features: Any = None,
    eval_cfg: Any = None,
    *,
    protocols: Sequence[str] | None = None,
    on_missing: OnMissing = "error",
    cache_dir: str | Path | None = None,
) -> dict[str, dict[str, Any]]:
    """Score every ``predictions/<protocol>/<picker>.json`` of a run; write ``metrics/<protocol>.json``.

    ``references``/``domains``: {image_id: [captions]} / {image_id: domain} of the split the
    predictions are for; default: read from the run (:func:`load_run_references`).
    ``features``: the feature table (pyarrow Table or rows) of that split, for CLIPScore and the
    rank statistics; default: the run's ``features/<benchmark>-<split>/`` when references are
    defaulted too. ``eval_cfg``: ``Config.eval`` (SPICE settings, java, CLIPScore w) or None
    (no SPICE); ``cache_dir`` (``Config.cache_dir``) is where downloaded CoreNLP jars are kept
    (default: the run's spice/ folder). Returns {protocol: metrics dict} (what is written).
    """
    run = run_dir if isinstance(run_dir, RunDir) else RunDir(run_dir)
    run_dir = run.path
    references, domains, features, failed = _run_inputs(run, references, domains, features)
    proto_names = [p for p in run.prediction_protocols() if protocols is None or p in set(protocols)]
    if not proto_names:
        raise FileNotFoundError(f"{run_dir / 'predictions'}: no predictions/<protocol>/ folders to evaluate; "
                                "run `adjcap fit` first")
    java = getattr(eval_cfg, "java", "java") if eval_cfg is not None else "java"
    w = float(getattr(eval_cfg, "clipscore_w", CLIPSCORE_W)) if eval_cfg is not None else CLIPSCORE_W
    spice = spice_from(eval_cfg, run_dir, cache_dir) if eval_cfg is not None else None
    import tempfile

    from adjcap.data.references import References

    run.metrics_dir.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.TemporaryDirectory(prefix=".eval-", dir=run.metrics_dir)
    tmp_dir = Path(tmp.name)

    refs_obj = References(captions={str(k): list(v) for k, v in references.items()})
    rank = retrieval_verifier_spearman(features) if features is not None else None
    ground_truth = getattr(eval_cfg, "chair", "proxy") if eval_cfg is not None else "proxy"
    objects, chair_note = instance_ground_truth(run, refs_obj.captions, ground_truth,
                                                getattr(eval_cfg, "coco_instances", ()))
    written: dict[str, dict[str, Any]] = {}
    with tmp, Evaluator(
        refs_obj.captions, domains, spice=spice, java=java, tmp_dir=tmp_dir, on_missing=on_missing,
        instance_objects=objects, chair_ground_truth=ground_truth,
    ) as ev:
        # every picker's and seed's captions tokenised at once (one Java process for the run, not one per file)
        ev.tokenize_ahead(_captions_of(run, proto_names, refs_obj, on_missing))
        for proto in proto_names:
            files = list(run.prediction_files(proto).values())
            if not files:
                continue
            pickers: dict[str, Any] = {}
            per_image: dict[str, Any] = {}
            picks: dict[str, dict[str, Any]] = {}

            def score_file(f: Path) -> tuple[dict[str, Any], dict[str, Any]]:
                return _score_file(f, ev, refs_obj, features, eval_cfg, w, on_missing, chair_note)

            for f in files:
                res, picks[f.stem] = score_file(f)
                per_image[f.stem] = res.pop("per_image")
                pickers[f.stem] = res
            seed_scored: dict[str, dict[int, Any]] = {}
            seed_per_image: dict[str, dict[int, Any]] = {}
            for (picker, seed), f in run.seed_prediction_files(proto).items():  # rerank.seeds
                res, _ = score_file(f)
                seed_per_image.setdefault(picker, {})[seed] = res.pop("per_image")
                seed_scored.setdefault(picker, {})[seed] = res
            doc = _protocol_doc(proto, run_dir, len(refs_obj.captions), pickers, _rank_stats(rank, picks), failed,
                                per_image, seed_scored, seed_per_image)
            run.write_metrics(proto, _clean_json(doc))
            written[proto] = doc
    return written


def _run_inputs(run: RunDir, references: Any, domains: Any, features: Any) -> tuple[Any, Any, Any, set]:
    """References, domains and features (the run's where not given) and the failed images' ids, which
    are left out of the references (their rows say why; every other image is scored)."""
    if references is None:
        references, dom2, feats2 = load_run_references(run)
        domains = domains if domains is not None else dom2
        features = features if features is not None else feats2
    failed = failed_image_ids(features, references)
    if failed:
        references = {k: v for k, v in references.items() if str(k) not in failed}
    return references, domains, features, failed


def _captions_of(run: RunDir, protocols: Sequence[str], refs_obj: Any, on_missing: OnMissing) -> set[str]:
    """The captions of every predictions file (each picker's and each seed's) of ``protocols``, as
    :func:`_score_file` resolves them. A file that cannot be read is left to :func:`_score_file` to
    report in its turn (the protocols scored before it are still written)."""
    out: set[str] = set()
    for proto in protocols:
        for f in [*run.prediction_files(proto).values(), *run.seed_prediction_files(proto).values()]:
            try:
                preds, _, _ = resolve_predictions(load_predictions(f), refs_obj.resolve, on_missing=on_missing,
                                                  source=str(f))
            except (OSError, ValueError, MetricError):
                continue
            out.update(preds.values())
    return out


def _score_file(f: Path, ev: Any, refs_obj: Any, features: Any, eval_cfg: Any, w: float, on_missing: OnMissing,
                chair_note: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """One predictions file scored by ``ev`` (CLIPScore from the features where given); and its picks' keys."""
    entries = load_predictions(f)
    preds, rows, _ = resolve_predictions(entries, refs_obj.resolve, on_missing=on_missing, source=str(f))
    res = ev.score(preds)
    if chair_note:
        res["notes"]["chair_instances"] = chair_note
    keys = {i: _pick_key(e) for i, e in rows.items()}
    if features is not None:
        cs = clipscore_from_features(features, keys, w=w)
        res["clipscore"] = cs.to_dict()
        if cs.source == "clipscore_cosine" and eval_cfg is not None and hasattr(eval_cfg, "clipscore"):
            res["clipscore"]["encoder"] = f"{eval_cfg.clipscore.model} {eval_cfg.clipscore.pretrained or ''}".strip()
        for i, v in cs.per_image.items():
            if i in res["per_image"]:
                res["per_image"][i]["CLIPScore"] = v
    return res, keys


def _protocol_doc(proto: str, run_dir: Path, n_references: int, pickers: dict, stats: dict, failed: set,
                  per_image: dict, seed_scored: dict, seed_per_image: dict) -> dict[str, Any]:
    """``metrics/<protocol>.json``: the pickers' scores, rank statistics, failed images, per-image scores
    and, with ``rerank.seeds``, the seed study."""
    doc: dict[str, Any] = {
        "protocol": proto,
        "run": str(run_dir),
        "n_references": n_references,
        "pickers": pickers,
        "rank_stats": stats,
        "failed_images": {"count": len(failed), "ids": sorted(failed)[:50],
                          "note": "images whose feature row has an error: not scored, counted here"},
        "per_image": per_image,
    }
    if seed_scored:
        study = seed_study(seed_scored, seed_per_image, {b: per_image[b] for b in BASELINES if b in per_image})
        study["per_image"] = {p: {str(s): v for s, v in d.items()} for p, d in seed_per_image.items()}
        doc["seeds"] = study
    return doc


def _rank_stats(rank: Any, picks: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """A protocol's rank statistics: retrieval-verifier Spearman, pick disagreement with LM-only, head agreement."""
    stats: dict[str, Any] = {}
    if rank is not None:
        stats["retrieval_verifier_spearman"] = rank
    if LM_PICKER in picks:
        stats["pick_disagreement_vs_lm"] = pick_disagreement(picks, LM_PICKER)
    if all(h in picks for h in HEAD_PICKERS):
        stats["top1_agreement_heads"] = top1_agreement(*(picks[h] for h in HEAD_PICKERS))
    return stats


def _clean_json(obj: Any) -> Any:
    """NaN -> None recursively (JSON has no NaN)."""
    if isinstance(obj, float):
        return None if math.isnan(obj) else obj
    if isinstance(obj, Mapping):
        return {str(k): _clean_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean_json(v) for v in obj]
    return obj

"""COCO caption metrics (BLEU-1..4, METEOR, ROUGE-L, CIDEr, SPICE) through pycocoevalcap 1.2.

Predictions and references are PTB-tokenised with pycocoevalcap's tokenizer jar, then scored with
pycocoevalcap's own ``Bleu(4)``, ``Rouge`` and ``Cider`` classes and its METEOR jar (see
:mod:`adjcap.metrics.meteor`), so values equal a direct pycocoevalcap evaluation of the same data.
Everything is reported x100 under the paper's column names. CIDEr is corpus-level (its IDF comes
from the references of the images scored together), so each corpus (e.g. each NoCaps domain) is
scored on its own.
"""

from __future__ import annotations

import contextlib
import io
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from adjcap.data.domains import normalize_domain
from adjcap.java.runtime import MetricError
from adjcap.metrics.meteor import MeteorScorer, meteor_scores, try_shared_meteor
from adjcap.metrics.tokenizer import ptb_tokenize

# paper column names, in table order
METRIC_NAMES = ("B-1", "B-2", "B-3", "B-4", "METEOR", "ROUGE-L", "CIDEr", "SPICE")
# the short headers the paper's tables use
SHORT_NAMES = {"B-4": "B-4", "METEOR": "MET", "ROUGE-L": "R-L", "CIDEr": "CIDEr", "SPICE": "SPICE"}

OnMissing = Literal["error", "intersection"]


class MissingReferences(MetricError):
    """Predictions and references do not cover the same images."""


@dataclass
class MetricResult:
    """Corpus scores (x100; ``None`` = not computed, never 0), per-image scores, notes.

    ``per_image[id]`` holds x100 per-image values (CIDEr, B-4, METEOR, ROUGE-L, SPICE when run).
    ``notes`` explains missing metrics (e.g. why SPICE is ``None``) and dropped images.
    """

    scores: dict[str, float | None]
    per_image: dict[Hashable, dict[str, float]] = field(default_factory=dict)
    n_images: int = 0
    notes: dict[str, str] = field(default_factory=dict)

    def __getitem__(self, key: str) -> float | None:
        return self.scores[key]

    def to_dict(self, per_image: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "scores": {k: _json_float(v) for k, v in self.scores.items()},
            "n_images": self.n_images,
            "notes": dict(self.notes),
        }
        if per_image:
            out["per_image"] = {
                str(k): {m: _json_float(v) for m, v in d.items()} for k, d in self.per_image.items()
            }
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MetricResult:
        return cls(
            scores=dict(d.get("scores", {})),
            per_image=dict(d.get("per_image", {})),
            n_images=int(d.get("n_images", 0)),
            notes=dict(d.get("notes", {})),
        )


def _json_float(v: float | None) -> float | None:
    if v is None:
        return None
    v = float(v)
    return None if math.isnan(v) else v


# ---------------------------------------------------------------------------------------------
# input checks
# ---------------------------------------------------------------------------------------------


def _preview(ids: Sequence[Hashable], n: int = 5) -> str:
    shown = ", ".join(repr(i) for i in list(ids)[:n])
    return shown + (", ..." if len(ids) > n else "")


def align(
    predictions: Mapping[Hashable, str],
    references: Mapping[Hashable, Sequence[str]],
    on_missing: OnMissing = "error",
) -> tuple[dict[Hashable, str], dict[Hashable, list[str]], dict[str, str]]:
    """Check that predictions and references cover the same images.

    ``on_missing="error"`` (default) raises :class:`MissingReferences` naming the first few ids;
    ``"intersection"`` scores only images present in both and says so in the returned notes.
    """
    no_refs = [i for i in predictions if i not in references or not references[i]]
    no_pred = [i for i in references if i not in predictions]
    notes: dict[str, str] = {}
    if on_missing == "error":
        msgs = []
        if no_refs:
            msgs.append(
                f"{len(no_refs)} predicted image id(s) have no references: {_preview(no_refs)} "
                "(check that the prediction ids use the reference file's ids: numeric COCO ids or file names)"
            )
        if no_pred:
            msgs.append(
                f"{len(no_pred)} of {len(references)} reference images have no prediction: {_preview(no_pred)}"
            )
        if msgs:
            raise MissingReferences(
                "; ".join(msgs) + ". To score only the images present in both, pass "
                "on_missing='intersection' (CLI: --intersection)."
            )
    elif on_missing != "intersection":
        raise ValueError(f"on_missing must be 'error' or 'intersection', not {on_missing!r}")
    preds = {i: predictions[i] for i in predictions if i in references and references[i]}
    refs = {i: list(references[i]) for i in preds}
    if not preds:
        raise MissingReferences(
            f"no predicted image id is in the references (predictions e.g. {_preview(list(predictions))}; "
            f"references e.g. {_preview(list(references))})"
        )
    if no_refs:
        notes["dropped_predictions"] = f"{len(no_refs)} predictions without references were not scored"
    if no_pred:
        notes["unpredicted_references"] = f"{len(no_pred)} reference images without a prediction were not scored"
    for i, c in preds.items():
        if not isinstance(c, str):
            raise TypeError(f"prediction for {i!r} is {type(c).__name__}, expected a caption string")
    return preds, refs, notes


# ---------------------------------------------------------------------------------------------
# scoring of tokenised text
# ---------------------------------------------------------------------------------------------


def score_tokenized(
    gts: Mapping[Hashable, list[str]],
    res: Mapping[Hashable, list[str]],
    *,
    meteor: MeteorScorer | None = None,
    java: str = "java",
) -> MetricResult:
    """BLEU/METEOR/ROUGE-L/CIDEr on PTB-tokenised {id: [refs]} and {id: [prediction]} (same keys).

    METEOR runs in the process-wide shared Java process unless ``meteor`` is given.
    """
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge

    if gts.keys() != res.keys():
        raise ValueError("references and predictions must have the same image ids in the same order")
    ids = list(gts.keys())
    scores: dict[str, float | None] = {m: None for m in METRIC_NAMES}
    per: dict[Hashable, dict[str, float]] = {i: {} for i in ids}

    bleu, bleu_per, bleu_stats = bleu_with_statistics(gts, res)
    for n in range(4):
        scores[f"B-{n + 1}"] = 100.0 * float(bleu[n])
    for i, s in zip(ids, bleu_per[3]):
        per[i]["B-4"] = 100.0 * float(s)
        per[i].update(bleu_stats[i])

    notes: dict[str, str] = {}
    met = meteor_scores(gts, res, meteor=meteor, java=java)  # a METEOR failure loses METEOR only
    if met.note:
        notes["METEOR"] = met.note
    if met.score is not None and met.per_image is not None:
        scores["METEOR"] = 100.0 * float(met.score)
        for i, s in zip(ids, met.per_image):
            per[i]["METEOR"] = 100.0 * float(s)

    r, r_per = Rouge().compute_score(gts, res)
    scores["ROUGE-L"] = 100.0 * float(r)
    for i, s in zip(ids, r_per):
        per[i]["ROUGE-L"] = 100.0 * float(s)

    c, c_per = Cider().compute_score(gts, res)
    scores["CIDEr"] = 100.0 * float(c)
    for i, s in zip(ids, c_per):
        per[i]["CIDEr"] = 100.0 * float(s)
    return MetricResult(scores=scores, per_image=per, n_images=len(ids), notes=notes)


# per-image BLEU statistics kept in ``per_image`` (corpus BLEU-4 of any subset of images is
# :func:`adjcap.metrics.bootstrap.corpus_bleu4` of their sums): hypothesis length, closest reference
# length, n-gram guesses and matches for n = 1..4
BLEU_STAT_KEYS = ("bleu_testlen", "bleu_reflen", *(f"bleu_guess{n}" for n in range(1, 5)),
                  *(f"bleu_correct{n}" for n in range(1, 5)))


def bleu_with_statistics(gts: Mapping[Hashable, list[str]], res: Mapping[Hashable, list[str]]
                         ) -> tuple[list[float], list[list[float]], dict[Hashable, dict[str, float]]]:
    """pycocoevalcap's ``Bleu(4).compute_score`` (the same scorer, option "closest") and each image's
    statistics {BLEU_STAT_KEYS: value}, so that corpus BLEU can be recomputed on resampled images."""
    from pycocoevalcap.bleu.bleu_scorer import BleuScorer

    ids = list(gts)
    scorer = BleuScorer(n=4)
    for i in ids:
        assert len(res[i]) == 1 and len(gts[i]) >= 1
        scorer += (res[i][0], gts[i])
    with contextlib.redirect_stdout(io.StringIO()):
        score, per = scorer.compute_score(option="closest", verbose=0)
    stats: dict[Hashable, dict[str, float]] = {}
    for i, comps in zip(ids, scorer.ctest):
        testlen = comps["testlen"]
        reflen = min((abs(r - testlen), r) for r in comps["reflen"])[1]  # "closest", as compute_score
        vals = [testlen, reflen, *comps["guess"][:4], *comps["correct"][:4]]
        stats[i] = {k: float(v) for k, v in zip(BLEU_STAT_KEYS, vals)}
    return score, per, stats


def _tokenize_pair(
    preds: Mapping[Hashable, str], refs: Mapping[Hashable, Sequence[str]], java: str, tmp_dir: str | Path | None
) -> tuple[dict[Hashable, list[str]], dict[Hashable, list[str]]]:
    # references and predictions are tokenised in two calls, as pycocoevalcap's COCOEvalCap does
    gts = ptb_tokenize(refs, java=java, tmp_dir=tmp_dir)
    res = ptb_tokenize({i: [c] for i, c in preds.items()}, java=java, tmp_dir=tmp_dir)
    return gts, res


def spice_per_image(
    preds: Mapping[Hashable, str], refs: Mapping[Hashable, Sequence[str]], spice: Any
) -> tuple[dict[Hashable, float] | None, str | None]:
    """Per-image SPICE (x100) on raw text (SPICE parses untokenised captions, as in pycocoevalcap),
    or (None, reason) when not requested or unavailable."""
    from adjcap.metrics.spice import SpiceUnavailable, compute_spice

    if spice is None:
        return None, "not requested"
    try:
        _, per = compute_spice(preds, refs, spice)
    except SpiceUnavailable as e:
        if getattr(spice, "required", False):
            raise
        return None, f"n/a: {e}"
    return per, None


def attach_spice(result: MetricResult, per: dict[Hashable, float] | None, reason: str | None) -> None:
    """SPICE of a corpus = mean of its images' SPICE (pycocoevalcap's average); a per-image score
    does not depend on the other images, so one SPICE run serves every subset."""
    if per is None:
        result.notes["SPICE"] = reason or "n/a"
        return
    vals = []
    for i in result.per_image:
        v = per.get(i, float("nan"))
        result.per_image[i]["SPICE"] = v
        vals.append(v)
    result.scores["SPICE"] = float(np.mean(np.array(vals, dtype=np.float64))) if vals else None


def coco_metrics(
    predictions: Mapping[Hashable, str],
    references: Mapping[Hashable, Sequence[str]],
    *,
    spice: Any = None,
    on_missing: OnMissing = "error",
    java: str = "java",
    tmp_dir: str | Path | None = None,
    meteor: MeteorScorer | None = None,
) -> MetricResult:
    """Score {image_id: caption} against {image_id: [reference, ...]}.

    ``spice``: a :class:`adjcap.metrics.spice.SpiceConfig` to also run SPICE, or None. SPICE that
    cannot run (no CoreNLP jars, ...) is reported as ``None`` with the reason in ``notes["SPICE"]``
    (never as 0) unless the config says ``required=True``.
    ``on_missing``: see :func:`align`.
    """
    preds, refs, notes = align(predictions, references, on_missing)
    if meteor is None:
        try_shared_meteor(java)  # the JVM loads its paraphrase table while the captions are tokenised
    gts, res = _tokenize_pair(preds, refs, java, tmp_dir)
    result = score_tokenized(gts, res, meteor=meteor, java=java)
    result.notes.update(notes)
    attach_spice(result, *spice_per_image(preds, refs, spice))
    return result


def coco_metrics_by_domain(
    predictions: Mapping[Hashable, str],
    references: Mapping[Hashable, Sequence[str]],
    domains: Mapping[Hashable, str],
    *,
    spice: Any = None,
    on_missing: OnMissing = "error",
    java: str = "java",
    tmp_dir: str | Path | None = None,
    order: Sequence[str] = ("in-domain", "near-domain", "out-domain"),
) -> dict[str, MetricResult]:
    """NoCaps-style scoring: each domain as its own corpus, plus ``"overall"`` over all images.

    ``domains`` maps image id -> domain name (``in_domain``/``in-domain``/``in`` are all accepted
    and reported as ``in-domain``, etc.). Tokenisation and the METEOR process are shared.
    """
    preds, refs, notes = align(predictions, references, on_missing)
    missing_domain = [i for i in preds if i not in domains or not domains[i]]
    if missing_domain:
        raise MetricError(
            f"{len(missing_domain)} images have no domain label: {_preview(missing_domain)} "
            "(NoCaps references must carry in/near/out-domain labels)"
        )
    try_shared_meteor(java)  # starts loading while the captions are tokenised
    gts, res = _tokenize_pair(preds, refs, java, tmp_dir)
    by_domain: dict[str, list[Hashable]] = {}
    for i in preds:
        by_domain.setdefault(normalize_domain(domains[i]) or str(domains[i]), []).append(i)
    names = [d for d in order if d in by_domain] + sorted(d for d in by_domain if d not in order)
    out: dict[str, MetricResult] = {}
    met = try_shared_meteor(java)
    for d in names:
        ids = by_domain[d]
        out[d] = score_tokenized({i: gts[i] for i in ids}, {i: res[i] for i in ids}, meteor=met)
    overall = score_tokenized(gts, res, meteor=met)
    overall.notes.update(notes)
    out["overall"] = overall
    spice_per, reason = spice_per_image(preds, refs, spice)
    for r in out.values():
        attach_spice(r, spice_per, reason)
    return out

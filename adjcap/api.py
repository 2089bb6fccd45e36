"""The Python API: what the command line does, as functions with typed results.

    import adjcap

    result = adjcap.caption("my-photos/", preset="demo")        # -> Captions
    for c in result:
        print(c.image, c.caption)

    run = adjcap.run("demo", preset="demo", overrides=["rerank.beta=0.6"])   # -> Run
    print(run.metrics["inductive", "ensemble"]["CIDEr"])
    table = run.samples                                          # pyarrow.Table (run.samples_df(): pandas)

    m = adjcap.evaluate("preds.json", "dataset_coco.json", split="test")     # -> Metrics
    run = adjcap.load_run("runs/demo")                            # a finished run directory -> Run

The package's Python entry point, as adjcap/__main__ is its command-line one (docs/architecture.md,
"Layers"): the results it returns read run directories through the library, and only the two
functions that run a job (``caption``, ``run``) import the application layer, inside themselves, so
``import adjcap`` and ``adjcap.caption`` load neither Ray nor torch. Nothing in the library imports
this module except ``adjcap/__init__``, which exposes these names lazily (PEP 562). Errors are the
jobs' own one-line exceptions (ConfigError, DataError, ...); nothing is printed that the command line
would not print.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from adjcap.config import Config, load_config
from adjcap.storage.rundir import RunDir

if TYPE_CHECKING:  # pragma: no cover - types only
    import pandas
    import pyarrow as pa

__all__ = ["Candidate", "Caption", "Captions", "Metrics", "Run", "caption", "evaluate", "load_run", "run"]

# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """One beam candidate of an image with its three judges' scores."""

    text: str
    lm_logprob_mean: float
    retrieval_cosine: float
    verifier: float
    beam_rank: int
    chosen: bool


@dataclass(frozen=True)
class Caption:
    """The caption chosen for one image. ``caption`` is None (and ``error`` says why) when the image
    failed; ``lm_caption`` is IFCap's own pick (the beam's best)."""

    image: Path
    image_id: str
    caption: str | None
    lm_caption: str | None
    picker: str
    error: str | None
    candidates: tuple[Candidate, ...]


@dataclass(frozen=True)
class Captions:
    """What :func:`caption` returns: one :class:`Caption` per image (in image-id order), and where
    the run directory, ``captions.jsonl`` and the HTML gallery are."""

    captions: list[Caption]
    picker: str
    run_dir: Path
    jsonl: Path
    gallery: Path

    def __iter__(self) -> Iterator[Caption]:
        return iter(self.captions)

    def __len__(self) -> int:
        return len(self.captions)

    def __getitem__(self, i: int) -> Caption:
        return self.captions[i]

    def table(self) -> "pa.Table":
        """One row per image: image, image_id, caption, lm_caption, picker, error, candidates (list of structs)."""
        import pyarrow as pa

        return pa.Table.from_pylist([
            {"image": str(c.image), "image_id": c.image_id, "caption": c.caption, "lm_caption": c.lm_caption,
             "picker": c.picker, "error": c.error, "candidates": [vars(x) for x in c.candidates]}
            for c in self.captions
        ])

    def to_pandas(self) -> "pandas.DataFrame":
        return self.table().to_pandas()


@dataclass(frozen=True)
class Metrics:
    """Scores of one set of predictions: ``scores`` (BLEU-4, METEOR, ROUGE-L, CIDEr, SPICE, ... x100;
    a metric that could not be computed is missing and ``notes`` says why), the CHAIR proxy, NoCaps
    ``domains`` when the references have them, and the per-image scores (:meth:`per_image_table`)."""

    scores: dict[str, float]
    n_images: int
    chair: dict[str, Any] | None = None
    clipscore: dict[str, Any] | None = None
    domains: dict[str, dict[str, float]] | None = None
    notes: dict[str, Any] = field(default_factory=dict)
    per_image: dict[str, dict[str, float]] = field(default_factory=dict, repr=False)

    def __getitem__(self, metric: str) -> float:
        from adjcap.registry import lookup

        return lookup(self.scores, metric, "metric", KeyError)

    @classmethod
    def from_result(cls, res: Mapping[str, Any], per_image: Mapping[str, Any] | None = None) -> "Metrics":
        """From a scored result (``Evaluator.score`` / ``metrics/<protocol>.json``'s ``pickers`` entries)."""
        scores = {k: v for k, v in dict(res.get("metrics") or {}).items() if isinstance(v, (int, float))}
        chair = res.get("chair")
        if chair:
            scores.update({k: v for k, v in chair.items() if k in ("CHAIR_s", "CHAIR_i") and isinstance(v, (int, float))})
        cs = res.get("clipscore")
        if cs and isinstance(cs.get("CLIPScore"), (int, float)):
            scores["CLIPScore"] = cs["CLIPScore"]
        return cls(scores=scores, n_images=int(res.get("n_images", 0)), chair=chair, clipscore=cs,
                   domains=res.get("domains"), notes=dict(res.get("notes") or {}),
                   per_image={str(k): dict(v) for k, v in dict(per_image if per_image is not None
                                                              else res.get("per_image") or {}).items()})

    def per_image_table(self) -> "pa.Table":
        """One row per scored image: ``image_id`` and each per-image metric."""
        import pyarrow as pa

        return pa.Table.from_pylist([{"image_id": i, **v} for i, v in sorted(self.per_image.items())])


@dataclass(frozen=True)
class Run:
    """A run directory read back: its config, metrics per ``(protocol, picker)``, predictions and the
    per-sample table (``samples.parquet``: one row per image, candidates, every judge's score, every
    picker's pick, per-image metrics)."""

    path: Path
    config: Config
    metrics: dict[tuple[str, str], Metrics]

    @property
    def protocols(self) -> list[str]:
        return RunDir(self.path).prediction_protocols()

    def predictions(self, protocol: str, picker: str) -> list[dict[str, Any]]:
        """The COCO results list ``[{image_id, caption, ...}]`` a picker wrote under a protocol."""
        from adjcap.registry import lookup

        rd = RunDir(self.path)
        lookup(dict.fromkeys(rd.prediction_protocols()), protocol, f"protocol in {self.path}", KeyError)
        return json.loads(lookup(rd.prediction_files(protocol), picker, f"picker in {self.path}/predictions/{protocol}",
                                 KeyError).read_text(encoding="utf-8"))

    @property
    def samples(self) -> "pa.Table":
        """``samples.parquet`` as a pyarrow Table (one row per image)."""
        import pyarrow.parquet as pq

        p = RunDir(self.path).samples_path
        if not p.exists():
            raise FileNotFoundError(f"{p}: no per-sample table in this run (written after evaluation; "
                                    f"rerun with evaluation, or `adjcap evaluate --run {self.path}`)")
        return pq.read_table(p)

    def samples_df(self) -> "pandas.DataFrame":
        return self.samples.to_pandas()

    @property
    def report(self) -> Path:
        return RunDir(self.path).report_md


# --------------------------------------------------------------------------------------------
# Functions
# --------------------------------------------------------------------------------------------


def _config(preset: str | None, overrides: Sequence[str] | Mapping[str, Any] | None, config_file: str | Path | None,
            updates: Mapping[str, Any]) -> Config:
    """Preset + overrides (``["key=value", ...]`` or ``{"key": value}``) + the function's own options."""
    if isinstance(overrides, str):
        overrides = [overrides]
    typed = dict(overrides) if isinstance(overrides, Mapping) else {}
    texts = [] if isinstance(overrides, Mapping) else list(overrides or [])
    return load_config(None if config_file else preset, texts, config_file,
                       updates={**typed, **{k: v for k, v in updates.items() if v is not None}})


def _stage_images(images: Sequence[Any], root: Path) -> tuple[Path, dict[str, Path]]:
    """A list of image files (or PIL images) as one folder the caption job can read: hard links to the
    files (copies across file systems; PIL images saved as PNG) in ``root/images-<hash of the inputs>``.
    Returns the folder and {image id in it: the original path}."""
    from PIL import Image

    paths: list[Path | Image.Image] = []
    for x in images:
        if isinstance(x, Image.Image):
            paths.append(x)
            continue
        p = Path(x).expanduser().resolve()
        if not p.is_file():
            raise FileNotFoundError(f"{p}: no such image file")
        paths.append(p)
    digest = hashlib.sha256()
    for p in paths:
        digest.update(p.tobytes() if isinstance(p, Image.Image) else str(p).encode())
        digest.update(b"\0")
    folder = root / f"images-{digest.hexdigest()[:12]}"
    folder.mkdir(parents=True, exist_ok=True)
    origin: dict[str, Path] = {}
    for i, p in enumerate(paths):
        name = f"{i:05d}-" + ("image.png" if isinstance(p, Image.Image) else p.name)
        dest = folder / name
        if isinstance(p, Image.Image):
            if not dest.exists():
                p.save(dest.with_suffix(".tmp.png"))
                os.replace(dest.with_suffix(".tmp.png"), dest)
        elif not dest.exists() or dest.is_symlink():  # a hard link (the decoder refuses symlinks), else a copy
            try:
                dest.unlink(missing_ok=True)
                os.link(p, dest)
            except OSError:
                import shutil

                shutil.copyfile(p, dest.with_suffix(".tmp"))
                os.replace(dest.with_suffix(".tmp"), dest)
        origin[name] = dest if isinstance(p, Image.Image) else p
    return folder, origin


def caption(images: str | os.PathLike | Sequence[Any], preset: str = "headline", heads: str | Path | None = None, *,
            overrides: Sequence[str] | Mapping[str, Any] | None = None, workers: int | None = None,
            run_dir: str | Path | None = None, config_file: str | Path | None = None,
            address: str | None = None) -> Captions:
    """Caption your own images with the whole method (``adjcap caption``): ``images`` is a folder
    (searched recursively) or a list of image files / PIL images. ``heads``: a run's ``heads/`` fitted
    earlier (default: the training-free picker). ``overrides``: ``["key=value", ...]`` or
    ``{"key": value}`` as ``--set``. Starts (and stops) a local Ray unless ``address`` names a cluster."""
    from adjcap.jobs import caption as job  # here, not at the top: accessing adjcap.caption loads no Ray

    cfg = _config(preset, overrides, config_file, {"ray.workers": workers, "ray.address": address})
    if isinstance(images, (str, os.PathLike)):
        folder, origin = Path(images).expanduser().resolve(), None
    else:
        folder, origin = _stage_images(list(images), Path(cfg.resolved().paths.runs_dir) / "caption-inputs")
    if not folder.is_dir():
        raise NotADirectoryError(f"{folder}: not a folder; give a folder of images or a list of image files")
    jsonl = Path(job.main(cfg, folder, heads=heads, run_dir=run_dir))  # written in the run directory
    out = []
    for line in jsonl.read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        iid = str(r["image_id"])
        image = origin.get(iid, folder / iid) if origin is not None else folder / iid
        out.append(Caption(image=image, image_id=iid, caption=r["caption"], lm_caption=r.get("lm_caption"),
                           picker=r["picker"], error=r.get("error"),
                           candidates=tuple(Candidate(**c) for c in r.get("candidates") or ())))
    picker = out[0].picker if out else cfg.rerank.picker
    return Captions(captions=out, picker=picker, run_dir=jsonl.parent, jsonl=jsonl, gallery=jsonl.with_suffix(".html"))


def run(benchmark: str, preset: str | None = None, overrides: Sequence[str] | Mapping[str, Any] | None = None, *,
        workers: int | None = None, limit: int | None = None, run_dir: str | Path | None = None,
        resume: bool = True, evaluate: bool = True, config_file: str | Path | None = None,
        address: str | None = None) -> Run:
    """Run a benchmark end to end (``adjcap run-job``): features on the Ray pools (or in this process
    with the override ``executor=local``), fit, predict, evaluate, report. ``preset``: default ``headline`` (``demo`` for the demo benchmark).
    Returns the finished run directory read back (:func:`load_run`)."""
    from adjcap.jobs import demo, run as run_job  # here, not at the top: accessing adjcap.run loads no Ray

    cfg = _config(preset or ("demo" if benchmark == "demo" else "headline"), overrides, config_file,
                  {"benchmark": benchmark, "ray.workers": workers, "limit": limit, "ray.address": address})
    job = demo.main if benchmark == "demo" else run_job.main
    rd = job(cfg, run_dir=run_dir, resume=resume, evaluate_after=evaluate)
    return load_run(rd.path if isinstance(rd, RunDir) else rd)


def evaluate(predictions: str | Path | Sequence[Mapping[str, Any]] | Mapping[str, str],
             references: str | Path | Mapping[str, Sequence[str]], *, format: str = "auto",
             split: str | None = None, spice: bool = False, intersection: bool = False) -> Metrics:
    """Score captions (``adjcap evaluate``): ``predictions`` is a COCO results JSON file, a list of
    ``{"image_id", "caption"}`` or ``{image_id: caption}``; ``references`` a reference file (COCO,
    Karpathy, NoCaps, IFCap; ``format``/``split`` as on the command line) or ``{image_id: [captions]}``.
    SPICE (Java, CoreNLP jars) only with ``spice=True``. Needs no Ray and no model."""
    from adjcap.metrics.evaluate import Evaluator, evaluate_predictions, load_predictions, resolve_predictions

    on_missing = "intersection" if intersection else "error"
    spice_cfg = load_config("headline").resolved().eval if spice else None
    if not isinstance(references, Mapping):
        return Metrics.from_result(evaluate_predictions(predictions, references, fmt=format, split=split,
                                                        spice_cfg=spice_cfg, on_missing=on_missing))
    from adjcap.data.references import References
    from adjcap.java.runtime import MetricError
    from adjcap.metrics.spice import SpiceConfig

    refs = References(captions={str(k): list(v) for k, v in references.items()})
    preds, _, _ = resolve_predictions(load_predictions(predictions), refs.resolve, on_missing=on_missing)
    if not preds:
        raise MetricError("no predicted image id matches the references")
    spice_conf = SpiceConfig.from_eval_cfg(spice_cfg, None) if spice_cfg is not None else None
    with Evaluator(refs.captions, None, spice=spice_conf, on_missing=on_missing) as ev:
        return Metrics.from_result(ev.score(preds))


def load_run(run_dir: str | Path) -> Run:
    """A finished (or partly finished) run directory read back: config, metrics, predictions, samples."""
    rd = RunDir(Path(run_dir).expanduser())
    cfg = rd.config()
    docs = rd.metrics_docs()
    metrics: dict[tuple[str, str], Metrics] = {}
    for proto in rd.prediction_protocols():
        doc = docs.get(proto)
        if doc is None:
            continue
        per_image = doc.get("per_image") or {}
        for picker, res in (doc.get("pickers") or {}).items():
            metrics[(proto, picker)] = Metrics.from_result(res, per_image.get(picker, {}))
    return Run(path=rd.path, config=cfg, metrics=metrics)

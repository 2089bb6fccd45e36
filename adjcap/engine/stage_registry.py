"""The stage registry: the built-in stages and model families, registered on import (the one place they
are), over the mechanism of :mod:`adjcap.engine.stage_records` (the records, the table, the lookups), whose
lookups this module hands on, so everything that walks the stages imports this one module: identity
(:mod:`adjcap.engine.identity`), the stage cache (:mod:`adjcap.engine.stage_cache`), the pools and their memory plan
(:mod:`adjcap.engine.pools`), progress, the in-process pipeline (:mod:`adjcap.engine.pipeline`) and the one pool actor
(``actors/pool.py``). docs/architecture.md, "The stage registry".

* the families: the retrieval encoder, the caption index, the verifier (the configured
  :mod:`adjcap.engine.verifier_families` record), the captioner (the configured :mod:`adjcap.engine.captioners`
  record) and the scorer (stage 4's encoders, reusing what its process holds);
* the stages: retrieve, verify, caption, score, each with its output columns and batch function
  (from :mod:`adjcap.engine.stages`).

Imports nothing heavy: PyTorch and the model libraries are imported by the loaders and batch
functions when they run.
"""

from __future__ import annotations

import logging
import pkgutil
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np
import pyarrow as pa

from adjcap.engine import captioners, verifier_families
from adjcap.engine.features import CANDIDATE, RETRIEVED, VERIFIED
from adjcap.engine.image_state import ImageState
from adjcap.engine.pixel_memo import clip_pixels, verifier_pixels
from adjcap.models import budget
from adjcap.engine.stage_records import (  # the mechanism, handed on: the lookups everything calls here
    Family, Loading, Reads, Stage, StageOutput, families_of, family, load_families, names, pixel_preps, register,
    registered, stage, stages,
)

if TYPE_CHECKING:
    from adjcap.config import Config

__all__ = ["Family", "Loading", "Reads", "Stage", "StageOutput", "families_of", "family", "load_families", "names",
           "pixel_preps", "register", "registered", "stage", "stages", "SearchIndex", "CAPTION_FIELDS",
           "SCORE_FIELDS"]

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------
# the families
# --------------------------------------------------------------------------------------------


def _precision(p: str, gpu: bool) -> int:
    return budget.precision_bytes(p, gpu)


def _load_retrieval(cfg: "Config", ld: Loading):
    """The retrieval encoder: its image tower, and its text tower too where the scorer shares the
    process (it reuses the encoder) - the in-process pipeline also encodes the corpus with it."""
    from adjcap.models.roles import load_retrieval_encoder

    towers = ("image", "text") if "scorer" in ld.holds else ("image",)
    return load_retrieval_encoder(cfg.retrieval.encoder, cfg.device, towers=towers)


def _pixels_retrieval(cfg: "Config") -> tuple[Any, ...]:
    return (clip_pixels(cfg.retrieval.encoder, cfg.paths.cache_dir),)


def _size_retrieval(cfg: "Config", gpu: bool, holds: frozenset[str]) -> tuple[int, int]:
    enc = cfg.retrieval.encoder
    n = budget.encoder_params(enc, ("image", "text") if "scorer" in holds else ("image",))
    return n, n * _precision(enc.precision, gpu)


@dataclass(frozen=True)
class SearchIndex:
    """The caption index a retriever searches and the corpus texts its ids point into."""

    index: Any
    texts: Any

    def search(self, *args, **kwargs):
        return self.index.search(*args, **kwargs)


def _load_index(cfg: "Config", ld: Loading) -> SearchIndex:
    """The job hands the pool the index (``given["index"]``): a :class:`adjcap.index.SharedIndex`
    (opened here on this device, without a copy on the CPU) or a ready :class:`SearchIndex`."""
    if "index" not in ld.given:
        raise ValueError("the caption index is built by the job and handed to the pool (given['index'])")
    g = ld.given["index"]
    return g if isinstance(g, SearchIndex) else SearchIndex(g.open(cfg.device), g.texts)


def _load_verifier(cfg: "Config", ld: Loading):
    from adjcap.models.roles import load_verifier

    return load_verifier(cfg.verifier, cfg.device)


def _verifier_env(cfg: "Config") -> Mapping[str, Any] | None:
    """The environment of a backend that runs in one of its own (the verifier family's record: ``lavis``,
    LAVIS's, which cannot share this one), else None."""
    own = verifier_families.isolated(cfg.verifier)
    return None if own is None else pkgutil.resolve_name(own.env)(cfg.paths.cache_dir)


def _score_verifier(states: list[ImageState], m: Mapping[str, Any], cfg: "Config") -> None:
    """The verifier half of stage 4, in the verifier's environment (the stage's cosines follow in its pool)."""
    from adjcap.engine import stages

    stages.score_verifier(states, m["verifier"], cfg.verifier.long_captions)


def _pixels_verifier(cfg: "Config") -> tuple[Any, ...]:
    return (verifier_pixels(cfg.verifier, cfg.paths.cache_dir),) if cfg.verifier.enabled else ()


def _size_verifier(cfg: "Config", gpu: bool, holds: frozenset[str]) -> tuple[int, int]:
    n = budget.verifier_params(cfg.verifier)
    return n, n * _precision(cfg.verifier.precision, gpu)


def _load_captioner(cfg: "Config", ld: Loading):
    """The configured captioner family's model (:mod:`adjcap.engine.captioners`: ifcap, hf, candidates). IFCap
    also gets the corpus captions' nouns for the frequency entity filter (tagged once per corpus and kept
    with the index: :mod:`adjcap.index.nouns`; when they cannot be had, the stage tags each image's
    captions itself, as before)."""
    model = captioners.family(cfg.captioner.family).load(cfg, cfg.device)
    if cfg.captioner.family == "ifcap":
        _attach_nouns(model, cfg, ld)
    return model


def _attach_nouns(role, cfg: "Config", ld: Loading) -> None:
    if "nouns" in ld.given:
        role.nouns = ld.given["nouns"]
        return
    from adjcap.index.nouns import nouns_for

    try:  # tagged by the job's index step; never the whole corpus here, in a GPU's actor
        role.nouns = nouns_for(cfg, tag_missing=False)
    except (LookupError, OSError, ValueError) as e:  # no corpus file here: tag per image
        log.warning(f"entities: tagging each image's captions (the corpus nouns are unavailable: {e})")
        return
    if role.nouns is None and cfg.captioner.entities.mode == "frequency":
        log.warning("entities: the corpus nouns were not tagged by the index step (adjcap encode-corpus); "
                    "tagging each image's captions")


def _size_captioner(cfg: "Config", gpu: bool, holds: frozenset[str]) -> tuple[int, int]:
    return captioners.family(cfg.captioner.family).size(cfg, gpu)


def _pixels_captioner(cfg: "Config") -> tuple[Any, ...]:
    return captioners.family(cfg.captioner.family).pixels(cfg)


def _load_scorer(cfg: "Config", ld: Loading):
    """Stage 4's encoders and verifier (:func:`adjcap.models.roles.load_scorer`), reusing the retrieval
    encoder and the verifier this process holds; the job may hand it ``given["verifier"]`` (None: the
    ``lavis`` backend scores with the verifier in a pool of its own)."""
    from adjcap.models.roles import load_scorer

    loaded = {f: ld.models[f] for f in ("retrieval", "verifier") if f in ld.models}
    if "verifier" in ld.given:
        loaded["verifier"] = ld.given["verifier"]
    return load_scorer(cfg.retrieval.encoder, cfg.scorer_encoder(), cfg.eval.clipscore, cfg.verifier, cfg.device,
                       loaded=loaded)


def _pixels_scorer(cfg: "Config") -> tuple[Any, ...]:
    """Every image tower stage 4 may run: the output and CLIPScore encoders (when an image lost its
    stage-1 embedding) and the verifier (when it lost its stage-2 encoding)."""
    cache = cfg.paths.cache_dir
    encs = (clip_pixels(cfg.scorer_encoder(), cache), clip_pixels(cfg.eval.clipscore, cache))
    return encs + _pixels_verifier(cfg)  # the lavis backend's: None (its pools decode the bytes)


def _spare_scorer(cfg: "Config") -> dict[str, str]:
    """The scorer's pixels it reads only for an image that lost what an earlier stage made: the output
    encoder's, when it is the retrieval encoder (stage 1's embedding is reused) and CLIPScore reads no
    image of that geometry itself; the verifier's, when the image carries stage 2's encoding
    (:func:`adjcap.engine.stages.score` re-encodes only the images without it)."""
    cache, out = cfg.paths.cache_dir, {}
    output, clipscore = cfg.scorer_encoder(), cfg.eval.clipscore
    own = clip_pixels(output, cache)
    if own is not None and output.same_model(cfg.retrieval.encoder):
        cs = clip_pixels(clipscore, cache)
        if clipscore.same_model(output) or cs is None or cs.key != own.key:
            out[own.key] = "retrieval_embedding"
    ver = _pixels_verifier(cfg)
    if ver and ver[0] is not None:
        out[ver[0].key] = "verifier_memo"
    return out


def _size_scorer(cfg: "Config", gpu: bool, holds: frozenset[str]) -> tuple[int, int]:
    """What :func:`_load_scorer` loads beyond the families it shares a process with: the output encoder
    (its text tower when it is the retrieval encoder: stage 1's image embedding is reused; nothing when
    the retrieval encoder is held with both towers), the CLIPScore encoder when it is another model,
    and the verifier unless held."""
    enc, out_enc, cs_enc = cfg.retrieval.encoder, cfg.scorer_encoder(), cfg.eval.clipscore
    parts: list[tuple[int, int]] = []
    if not out_enc.same_model(enc):
        parts.append((budget.encoder_params(out_enc), _precision(out_enc.precision, gpu)))
    elif "retrieval" not in holds:
        parts.append((budget.encoder_params(enc, ("text",)), _precision(enc.precision, gpu)))
    if not cs_enc.same_model(out_enc) and not (cs_enc.same_model(enc) and "retrieval" in holds):
        parts.append((budget.encoder_params(cs_enc), _precision(cs_enc.precision, gpu)))
    if "verifier" not in holds:
        parts.append((budget.verifier_params(cfg.verifier), _precision(cfg.verifier.precision, gpu)))
    return sum(n for n, _ in parts), sum(n * b for n, b in parts)


def _nothing(cfg: "Config", gpu: bool, holds: frozenset[str]) -> tuple[int, int]:
    return 0, 0  # the index lives in the node's object store, shared by the node's actors


# --------------------------------------------------------------------------------------------
# the stages: what each outputs (the stage cache's columns) and its batch function
# --------------------------------------------------------------------------------------------


# what stage 3 writes into a candidate; every other candidate field is a stage-4 score
CAPTION_FIELDS = ("text", "lm_logprob_sum", "lm_logprob_mean", "n_tokens", "beam_rank")
SCORE_FIELDS = tuple(f.name for f in CANDIDATE if f.name not in CAPTION_FIELDS)


def _give_retrieve(s: ImageState, o: dict[str, Any]) -> None:
    s.retrieved = [dict(r) for r in o["retrieved"]]
    emb = o.get("retrieval_embedding")
    s.retrieval_embedding = None if emb is None else np.asarray(emb, dtype=np.float32)


def _give_verify(s: ImageState, o: dict[str, Any]) -> None:
    s.retrieved = [dict(r) for r in o["retrieved"]]
    s.verified = [dict(v) for v in o["verified"]]
    s.verifier_backend = o.get("verifier_backend")


def _give_caption(s: ImageState, o: dict[str, Any]) -> None:
    s.entities = list(o["entities"] or [])
    s.prompt = o["prompt"]
    s.candidates = [dict(c) for c in o["candidates"]]


def _give_score(s: ImageState, o: dict[str, Any]) -> None:
    s.candidates = [dict(c) for c in o["candidates"]]


def _retrieve(states: list[ImageState], m: Mapping[str, Any], cfg: "Config") -> None:
    from adjcap.engine import stages

    stages.retrieve(states, m["retrieval"], m["index"], m["index"].texts, cfg.retrieval.top_l)


def _verify(states: list[ImageState], m: Mapping[str, Any], cfg: "Config") -> None:
    from adjcap.engine import stages

    stages.verify(states, m["verifier"], cfg.verifier.keep)


def _caption(states: list[ImageState], m: Mapping[str, Any], cfg: "Config") -> None:
    captioners.family(cfg.captioner.family).run(states, m["captioner"], cfg)


def _score(states: list[ImageState], m: Mapping[str, Any], cfg: "Config") -> None:
    from adjcap.engine import stages

    sc = m["scorer"]
    stages.score(states, sc.output, sc.verifier, sc.clipscore, reuse_image_embedding=sc.reuse_stage1,
                 long_captions=cfg.verifier.long_captions)


_ENC_SPEED = ("image_batch_size", "text_batch_size")


def _verifier_unread(cfg: "Config") -> tuple[str, ...]:
    """The verifier keys its family does not read (its record's ``unread``: :mod:`adjcap.engine.verifier_families`),
    and ``long_captions``, which stage 4 reads (the candidates, not the retrieved corpus captions)."""
    return verifier_families.unread(cfg.verifier) + ("verifier.long_captions",)

register(
    Family("retrieval", _load_retrieval, _size_retrieval, _pixels_retrieval),
    Family("index", _load_index, _nothing, lambda cfg: ()),  # reads no image
    Family("verifier", _load_verifier, _size_verifier, _pixels_verifier, env=_verifier_env,
           parts={"score": _score_verifier}),
    Family("captioner", _load_captioner, _size_captioner, _pixels_captioner),
    Family("scorer", _load_scorer, _size_scorer, _pixels_scorer, spare=_spare_scorer),
    Stage(
        "retrieve", "retriever", ("retrieval", "index"),
        Reads(("benchmark", "benchmarks.{benchmark}.images", "benchmarks.{benchmark}.format",
               "benchmarks.{benchmark}.exif_transpose", "device", "precision", "numerics", "tf32", "retrieval"),
              by_content=("retrieval.index_dir",),  # the searched index: identity.searched_index()
              speed=("retrieval.shard_size", *(f"retrieval.encoder.{k}" for k in _ENC_SPEED))),
        StageOutput(
            pa.schema([("image_id", pa.string()), ("retrieved", pa.list_(RETRIEVED)),
                       ("retrieval_embedding", pa.list_(pa.float32()))]),
            lambda s: {"retrieved": s.retrieved,
                       "retrieval_embedding": None if s.retrieval_embedding is None
                       else np.asarray(s.retrieval_embedding, dtype=np.float32).tolist()},
            # the verifier fills the retrieved captions' scores later in the same state: stored without them
            _give_retrieve, blank={"retrieved": ("verifier",)}),
        _retrieve, searches_index=True,
    ),
    Stage(
        "verify", "verifier", ("verifier",),
        Reads(("numerics", "tf32", "verifier"), speed=("verifier.batch_size",), unread=_verifier_unread),
        StageOutput(
            pa.schema([("image_id", pa.string()), ("retrieved", pa.list_(RETRIEVED)),
                       ("verified", pa.list_(VERIFIED)), ("verifier_backend", pa.string())]),
            lambda s: {"retrieved": s.retrieved, "verified": s.verified, "verifier_backend": s.verifier_backend},
            _give_verify),
        _verify,
    ),
    Stage(
        "caption", "captioner", ("captioner",),
        # captioner.search is not speed-only: the reference search's beams differ (the property test)
        Reads(("numerics", "tf32", "captioner"),
              # the candidates file's limits only refuse a file before the job: no output depends on them
              speed=("captioner.batch_size", "captioner.rows", "captioner.compile", "captioner.compile_cache",
                     "captioner.candidates.lm_batch_size",
                     "captioner.candidates.max_chars", "captioner.candidates.allow_missing",
                     *(f"captioner.clip.{k}" for k in _ENC_SPEED)),
              unread=captioners.unread),  # the other captioner families' settings
        StageOutput(
            pa.schema([("image_id", pa.string()), ("entities", pa.list_(pa.string())), ("prompt", pa.string()),
                       ("candidates", pa.list_(CANDIDATE))]),
            lambda s: {"entities": list(s.entities), "prompt": s.prompt, "candidates": s.candidates},
            # stage 4 fills the candidates' scores later in the same state: stored without them
            _give_caption, blank={"candidates": SCORE_FIELDS}),
        _caption,
    ),
    Stage(
        "score", "scorer", ("scorer",),
        Reads(("numerics", "tf32", "scorer.encoder", "eval.clipscore", "verifier.long_captions"),
              speed=(*(f"scorer.encoder.{k}" for k in _ENC_SPEED), *(f"eval.clipscore.{k}" for k in _ENC_SPEED))),
        StageOutput(pa.schema([("image_id", pa.string()), ("candidates", pa.list_(CANDIDATE))]),
                    lambda s: {"candidates": s.candidates}, _give_score),
        _score,
    ),
)

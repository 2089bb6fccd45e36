"""The models each pool holds, loaded from a resolved :class:`~adjcap.config.Config` (its sections'
paths already expanded by ``Config.resolved()``). The model families of the stage registry
(:mod:`adjcap.engine.stage_registry`) load through these functions, for the pool actor and the single-process
pipeline alike, so both hold exactly the same models. In one process (the fused pool, the pipeline) the
scorer reuses the retrieval encoder (both towers then) and the verifier.

| role                 | models                                                        |
|----------------------|---------------------------------------------------------------|
| retriever            | retrieval encoder, image tower (+ the caption index)          |
| corpus encoder       | retrieval encoder, text tower                                 |
| verifier             | ``verifier.family``'s judge: BLIP ITM, BLIP-2 ITM or an open_clip |
|                      | model (None when ``verifier.enabled`` is false)               |
| captioner            | IFCap + its CLIP (+ the CLIP-classifier entity vocabulary)    |
| scorer               | output-scorer encoder (``scorer.encoder``, default the retrieval |
|                      | encoder: its text tower, the image tower loaded on first need)  |
|                      | + the CLIPScore encoder (``eval.clipscore``, when it differs  |
|                      | from the output scorer) + the verifier                        |
"""

from __future__ import annotations

import json
import logging
import pkgutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from adjcap.engine import verifier_families
from adjcap.config import CaptionerCfg, ConfigError, EncoderCfg, VerifierCfg
from adjcap.models.entities import ensemble_embeddings

log = logging.getLogger(__name__)

# Each loader imports its model family (open_clip, transformers' BLIP, IFCap) when it runs: every pool's
# actor imports this module, and the verifier's has no use for open_clip (~0.8 CPU-s to import).


def load_retrieval_encoder(encoder: EncoderCfg, device: str, towers: tuple[str, ...] = ("image", "text")):
    from adjcap.models.clip import load_encoder_from_config

    return load_encoder_from_config(encoder, towers=towers, device=device)


class ScorerEncoder:
    """The retrieval encoder as the scorer pool holds it: the text tower at once; the image tower
    (the larger one: 1.8B of bigG-14's 2.5B parameters) only when an image must be re-encoded because
    its state lost the stage-1 embedding."""

    def __init__(self, encoder: EncoderCfg, device: str):
        self.cfg, self.device = encoder, device
        self.text = load_retrieval_encoder(encoder, device, towers=("text",))
        self.image: Any = None

    def encode_texts(self, *args, **kwargs):
        return self.text.encode_texts(*args, **kwargs)

    @property
    def pixel_prep(self):
        """The image tower's (known before it loads: :func:`adjcap.models.clip.pixel_prep_for`)."""
        from adjcap.models.clip import pixel_prep_for

        return pixel_prep_for(self.cfg) if self.image is None else self.image.pixel_prep

    def encode_images(self, *args, **kwargs):
        if self.image is None:
            self.image = load_retrieval_encoder(self.cfg, self.device, towers=("image",))
        return self.image.encode_images(*args, **kwargs)


def verifier_pixel_prep(v: VerifierCfg):
    """The image preprocessing the judge of ``v`` wants, without loading it (its family's ``pixels``:
    :mod:`adjcap.engine.pixel_prep`; None: not known before loading, or the ``lavis`` backend, which decodes in
    its own environment)."""
    if v.backend != "transformers":
        return None
    return pkgutil.resolve_name(verifier_families.of(v).pixels)(v)


def load_verifier(verifier: VerifierCfg, device: str):
    """The judge of ``verifier.family`` (its record's ``load``: :mod:`adjcap.engine.verifier_families`), with
    the verifier interface of :class:`adjcap.models.blip.Verifier` (encode_images, memo_from_image_embeds,
    score: one score per pair), or None when the verifier is disabled (presets without stage 2)."""
    if not verifier.enabled:
        return None
    own = verifier_families.isolated(verifier)  # a backend in its own environment (lavis): its loader
    return pkgutil.resolve_name(own.load if own else verifier_families.of(verifier).load)(verifier, device=device)


@dataclass
class CaptionerRole:
    captioner: Any
    clip: Any
    vocabulary: tuple[list[str], torch.Tensor] | None = None
    nouns: Any = None  # the corpus captions' nouns, tagged once (adjcap.index.nouns); None: tag per image


def load_captioner(c: CaptionerCfg, device: str) -> CaptionerRole:
    """IFCap, its CLIP, and the vocabulary for the CLIP-classifier entities (or None)."""
    from adjcap.models.clip import load_encoder_from_config
    from adjcap.models.ifcap import load_ifcap

    captioner = load_ifcap(c.checkpoint, lm_config=c.lm_config, tokenizer=c.tokenizer, device=device,
                           mapping_heads=c.mapping_heads, precision=c.precision, compile=c.compile,
                           compile_cache=c.compile_cache)
    clip = load_encoder_from_config(c.clip, device=device)
    vocabulary = entity_vocabulary(c, clip) if c.entities.mode == "clip_classifier" else None
    return CaptionerRole(captioner, clip, vocabulary)


def entity_vocabulary(c: CaptionerCfg, clip) -> tuple[list[str], torch.Tensor]:
    """Vocabulary names (lower-cased, stripped, sorted, as ViECap) and their 7-template ensemble
    embeddings computed with the captioner's CLIP (as IFCap's official code computes them)."""
    e = c.entities
    if not e.vocabulary:
        raise ConfigError("captioner.entities.mode=clip_classifier needs captioner.entities.vocabulary (a JSON list)")
    path = Path(e.vocabulary)
    if not path.exists():
        raise ConfigError(f"entity vocabulary {path} does not exist (captioner.entities.vocabulary)")
    data = json.loads(path.read_text())
    names = sorted({str(x).lower().strip() for x in (data.keys() if isinstance(data, dict) else data)})
    with torch.inference_mode():
        return names, ensemble_embeddings(names, lambda texts: clip.encode_texts(texts, normalize=True))


def same_encoder(a: EncoderCfg, b: EncoderCfg) -> bool:
    """Two encoder sections that load the same model at the same precision (batch sizes aside). Sections
    that differ in precision only are two models (their embeddings differ); the root ``precision`` sets
    every encoder's, so only a section set alone can differ: :func:`why_twice` says so in the log."""
    return a.same_model(b)


def why_twice(role: str, a: EncoderCfg, a_key: str, b: EncoderCfg, b_key: str) -> str | None:
    """The log line for an encoder loaded a second time only because its precision differs, or None."""
    if a.same_model(b) or (a.model, a.pretrained) != (b.model, b.pretrained):
        return None
    return (f"{role} loads a second {a.model} ({a_key}.precision={a.precision}, {b_key}.precision={b.precision}): "
            "the same weights at two precisions give other embeddings; set the root `precision` to load it once")


@dataclass
class ScorerRole:
    """Stage 4's models. ``output``: the encoder of the candidates' cosine s_R; ``reuse_stage1``: it is
    the retrieval encoder, so stage 1's image embedding is reused; ``clipscore``: the CLIPScore
    encoder, or None when it is the output encoder (its cosine is then the CLIPScore cosine)."""

    output: Any
    reuse_stage1: bool
    clipscore: Any
    verifier: Any


def load_scorer(retrieval: EncoderCfg, output: EncoderCfg, clipscore: EncoderCfg, verifier: VerifierCfg,
                device: str, loaded: dict[str, Any] | None = None) -> ScorerRole:
    """The scorer pool's models (sections resolved). ``loaded``: models this process already holds,
    {"retrieval": encoder, "verifier": verifier}, reused instead of loading them again."""
    loaded = loaded or {}
    for line in (why_twice("the output scorer", output, "scorer.encoder", retrieval, "retrieval.encoder"),
                 why_twice("CLIPScore", clipscore, "eval.clipscore", output, "the output scorer's")):
        if line:
            log.warning(line)
    reuse = same_encoder(output, retrieval)
    if reuse and loaded.get("retrieval") is not None:
        out_enc = loaded["retrieval"]
    elif reuse:  # the stage-1 image embedding rides in the state: the text tower, the image tower on need
        out_enc = ScorerEncoder(output, device)
    else:  # another encoder than stage 1's: every image is encoded here
        out_enc = load_retrieval_encoder(output, device)
    cs_enc = None if same_encoder(clipscore, output) else (
        loaded["retrieval"] if same_encoder(clipscore, retrieval) and loaded.get("retrieval") is not None
        else load_retrieval_encoder(clipscore, device))
    ver = loaded["verifier"] if "verifier" in loaded else load_verifier(verifier, device)
    return ScorerRole(out_enc, reuse, cs_enc, ver)

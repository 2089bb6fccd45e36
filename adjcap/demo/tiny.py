"""The tiny-model world: small models of the real classes, built deterministically and saved to disk
so the real loaders load them exactly as they load the released weights.

    {cache}/tiny/retrieval-clip/   open_clip `adjcap-tiny-clip-large` (retrieval encoder role, bigG's)
    {cache}/tiny/captioner-clip/   open_clip `adjcap-tiny-clip` (IFCap's CLIP role, ViT-B/32's)
    {cache}/tiny/blip-itm/         transformers BlipForImageTextRetrieval + BERT WordPiece tokenizer
    {cache}/tiny/gpt2-tokenizer/   GPT-2 byte-level BPE trained on the corpus
    {cache}/tiny/ifcap/            IFCap state dict with the official key names + GPT-2 config.json
    {cache}/tiny/vocabulary.json   entity vocabulary for the CLIP-classifier entity path
    {cache}/tiny/TRAINING.json     what the trainings did (steps, seconds, losses)
    {cache}/tiny/QUALITY.json      the judges' held-out quality: retrieval recall@1/5, ITM accuracy

Each family's builder saves a deterministic random model; :mod:`adjcap.demo.train` then trains
them briefly on the demo world (CLIP contrastively on rendered images, BLIP ITM on matched/mismatched
pairs, IFCap text-only as IFCap is trained) and writes them back in the same formats, so the demo
retrieves, verifies and captions sensibly.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from pathlib import Path
from typing import Sequence

from adjcap.demo.tiny_blip import build_tiny_blip
from adjcap.demo.tiny_clip import TINY_CLIP, TINY_CLIP_LARGE, build_tiny_clip
from adjcap.demo.quality import judge_quality
from adjcap.demo.tiny_ifcap import build_tiny_ifcap, train_gpt2_tokenizer
from adjcap.demo.train import TinyTrainSettings, train_tiny_world
from adjcap.io import atomic_write_json
from adjcap.models.clip import load_dual_encoder

READY = "READY.json"
QUALITY = "QUALITY.json"  # the judges' held-out quality (adjcap.demo.quality.judge_quality)
VERSION = 5
RETRIEVAL_CLIP = TINY_CLIP_LARGE  # the judge sees finer patches than the captioner's CLIP, as bigG/14 vs B/32
CAPTIONER_CLIP = TINY_CLIP


def world_fingerprint(texts: Sequence[str], seed: int, settings=None) -> str:
    from dataclasses import asdict

    train = json.dumps(asdict(settings or TinyTrainSettings()), sort_keys=True)
    h = hashlib.sha256(f"v{VERSION}|{seed}|{train}|".encode())
    for t in texts:
        h.update(t.encode())
        h.update(b"\n")
    return h.hexdigest()[:16]


def tiny_world_ready(root: Path, corpus_texts: Sequence[str], seed: int = 42, settings=None) -> bool:
    marker = Path(root) / READY
    if not marker.exists():
        return False
    try:
        return json.loads(marker.read_text()).get("fingerprint") == world_fingerprint(corpus_texts, seed, settings)
    except (OSError, ValueError):
        return False


def build_tiny_world(cache_dir: Path, corpus_texts: Sequence[str], seed: int = 42,
                     settings=None, workers: int | None = None) -> dict[str, Path]:
    """Build (or reuse) the tiny world under cache_dir/tiny: random models of the real classes, then
    trained on the demo world (``settings``: :class:`adjcap.demo.train.TinyTrainSettings`,
    default the demo's; a world built with other settings is rebuilt). ``workers``: processes to
    train in (default: the cores available, at most 2 used; the files do not depend on it).
    Idempotent: READY.json is written last."""
    root = Path(cache_dir) / "tiny"
    paths = {
        "retrieval_clip": root / "retrieval-clip" / "open_clip_model.safetensors",
        "captioner_clip": root / "captioner-clip" / "open_clip_model.safetensors",
        "blip": root / "blip-itm",
        "tokenizer": root / "gpt2-tokenizer",
        "ifcap": root / "ifcap" / "tiny-ifcap.pt",
        "vocabulary": root / "vocabulary.json",
    }
    settings = settings or TinyTrainSettings()
    if tiny_world_ready(root, corpus_texts, seed, settings):
        return paths
    root.mkdir(parents=True, exist_ok=True)
    (root / READY).unlink(missing_ok=True)
    build_tiny_clip(paths["retrieval_clip"], seed=seed, model=RETRIEVAL_CLIP)
    clip_path = build_tiny_clip(paths["captioner_clip"], seed=seed + 1, model=CAPTIONER_CLIP)
    build_tiny_blip(paths["blip"], list(corpus_texts), seed=seed, image_size=settings.blip_image_size)
    train_gpt2_tokenizer(list(corpus_texts), paths["tokenizer"])
    clip_dim = load_dual_encoder(CAPTIONER_CLIP, str(clip_path), device="cpu").embed_dim
    build_tiny_ifcap(paths["ifcap"].parent, paths["tokenizer"], clip_dim=clip_dim, seed=seed)
    logs = train_tiny_world(paths, corpus_texts, seed, settings, retrieval_model=RETRIEVAL_CLIP,
                            captioner_model=CAPTIONER_CLIP, workers=workers)
    atomic_write_json(root / "TRAINING.json", logs)
    atomic_write_json(root / QUALITY, judge_quality(root, seed, models={"retrieval": RETRIEVAL_CLIP,
                                                                        "captioner": CAPTIONER_CLIP}))
    atomic_write_json(paths["vocabulary"], entity_vocabulary(corpus_texts))
    atomic_write_json(root / READY, {"fingerprint": world_fingerprint(corpus_texts, seed, settings), "seed": seed,
                                     "paths": {k: str(v) for k, v in paths.items()}})
    return paths


def entity_vocabulary(texts: Sequence[str], size: int = 64) -> list[str]:
    """A small noun-ish vocabulary for the CLIP-classifier path: the most frequent lower-case words
    of four or more letters (the demo corpus is built from object and colour words)."""
    counts = Counter(w for t in texts for w in re.findall(r"[a-z]{4,}", t.lower()))
    return sorted(w for w, _ in counts.most_common(size))

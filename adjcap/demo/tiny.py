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
import sys
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

from adjcap.machine import numerics
from adjcap.demo.train_settings import TinyTrainSettings
from adjcap.storage.io import atomic_write_json

# The builders and trainers (open_clip, transformers' BLIP, IFCap) are imported only when a world is
# built: every demo job checks that its world is ready, and that check needs none of them.

READY = "READY.json"
QUALITY = "QUALITY.json"  # the judges' held-out quality (adjcap.demo.quality.judge_quality)
VERSION = 6  # 6: built with portable numerics (adjcap.machine.numerics.PIN)


def world_fingerprint(texts: Sequence[str], seed: int, settings=None) -> str:
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
    if not numerics.pinned():  # the same bits on every x86-64 CPU: built in a process started with the pin
        _build_pinned(cache_dir, corpus_texts, seed, settings, workers)
        if not tiny_world_ready(root, corpus_texts, seed, settings):
            raise RuntimeError(f"building the tiny models under {root} did not finish (no {READY}); "
                               "its error is printed above")
        return paths
    from adjcap.demo.quality import judge_quality
    from adjcap.demo.tiny_blip import build_tiny_blip
    from adjcap.demo.tiny_clip import TINY_CLIP, TINY_CLIP_LARGE, build_tiny_clip
    from adjcap.demo.tiny_ifcap import build_tiny_ifcap, train_gpt2_tokenizer
    from adjcap.demo.train import train_tiny_world
    from adjcap.models.clip import load_dual_encoder

    # the retrieval judge sees finer patches than the captioner's CLIP, as bigG/14 against B/32
    retrieval_clip, captioner_clip = TINY_CLIP_LARGE, TINY_CLIP
    build_tiny_clip(paths["retrieval_clip"], seed=seed, model=retrieval_clip)
    clip_path = build_tiny_clip(paths["captioner_clip"], seed=seed + 1, model=captioner_clip)
    build_tiny_blip(paths["blip"], list(corpus_texts), seed=seed, image_size=settings.blip_image_size)
    train_gpt2_tokenizer(list(corpus_texts), paths["tokenizer"])
    clip_dim = load_dual_encoder(captioner_clip, str(clip_path), device="cpu").embed_dim
    build_tiny_ifcap(paths["ifcap"].parent, paths["tokenizer"], clip_dim=clip_dim, seed=seed)
    logs = train_tiny_world(paths, corpus_texts, seed, settings, retrieval_model=retrieval_clip,
                            captioner_model=captioner_clip, workers=workers)
    atomic_write_json(root / "TRAINING.json", logs)
    atomic_write_json(root / QUALITY, judge_quality(root, seed, models={"retrieval": retrieval_clip,
                                                                        "captioner": captioner_clip}))
    atomic_write_json(paths["vocabulary"], entity_vocabulary(corpus_texts))
    atomic_write_json(root / READY, {"fingerprint": world_fingerprint(corpus_texts, seed, settings), "seed": seed,
                                     "paths": {k: str(v) for k, v in paths.items()}})
    return paths


def _build_pinned(cache_dir: Path, corpus_texts: Sequence[str], seed: int, settings: TinyTrainSettings,
                  workers: int | None) -> None:
    """:func:`build_tiny_world` in a fresh interpreter started with :data:`adjcap.machine.numerics.PIN` (the
    libraries read it when they load); the job goes through a file, the output is this process's."""
    from adjcap.demo.train import fresh_interpreter

    root = Path(cache_dir) / "tiny"
    job = root / "build-job.json"
    atomic_write_json(job, {"cache_dir": str(cache_dir), "texts": list(corpus_texts), "seed": seed,
                            "settings": asdict(settings), "workers": workers})
    proc = fresh_interpreter("adjcap.demo.tiny", job, numerics.pinned_env())
    try:
        rc = proc.wait()
    finally:
        if proc.poll() is None:  # interrupted: the build stops with its caller
            proc.kill()
            proc.wait()
        job.unlink(missing_ok=True)
    if rc != 0:
        raise RuntimeError(f"building the tiny models under {root} failed with exit code {rc}; its error is "
                           "printed above")


def _run_job(job: Path) -> None:
    spec = json.loads(job.read_text())
    build_tiny_world(Path(spec["cache_dir"]), spec["texts"], spec["seed"], TinyTrainSettings(**spec["settings"]),
                     spec["workers"])


MODEL_FILES = {  # what model_digests() hashes: each trained model's weights, by role
    "retrieval_clip": "retrieval-clip/open_clip_model.safetensors",
    "captioner_clip": "captioner-clip/open_clip_model.safetensors",
    "blip": "blip-itm/model.safetensors",
    "ifcap": "ifcap/tiny-ifcap.pt",
}


def model_digests(root: Path) -> dict[str, str]:
    """Per trained tiny model (:data:`MODEL_FILES`), a digest of its tensors: names, dtypes, shapes and
    bytes in name order (sha256, 16 hex digits), independent of how the file was written. Equal
    digests = bit-identical models; ``adjcap/demo/expected.json`` holds the ones every x86-64 CPU
    gives (tests/test_demo_portable.py)."""
    import torch
    from safetensors.torch import load_file

    out = {}
    for role, rel in MODEL_FILES.items():
        path = Path(root) / rel
        if path.suffix == ".safetensors":
            tensors = load_file(path)
        else:
            tensors = torch.load(path, map_location="cpu", weights_only=True)
        h = hashlib.sha256()
        for name in sorted(tensors):
            t = tensors[name].contiguous().reshape(-1)
            h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        out[role] = h.hexdigest()[:16]
    return out


def entity_vocabulary(texts: Sequence[str], size: int = 64) -> list[str]:
    """A small noun-ish vocabulary for the CLIP-classifier path: the most frequent lower-case words
    of four or more letters (the demo corpus is built from object and colour words)."""
    counts = Counter(w for t in texts for w in re.findall(r"[a-z]{4,}", t.lower()))
    return sorted(w for w, _ in counts.most_common(size))


if __name__ == "__main__":  # the pinned build (see _build_pinned)
    _run_job(Path(sys.argv[1]))

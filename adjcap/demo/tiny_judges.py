"""The demo world's judges of the other verifier families, built on first use (``adjcap reproduce
verifier-sweep --benchmark demo``, or any demo run with ``verifier.family`` set), never by ``make demo``:

    {cache}/tiny/blip2-itm/   transformers Blip2ForImageTextRetrieval (verifier.family = "blip2_itm")
    {cache}/tiny/siglip/      open_clip adjcap-tiny-sigmoid, a SigLIP (verifier.family = "clip")

Each is trained on the demo world (:mod:`adjcap.demo.tiny_blip2`, :mod:`adjcap.demo.tiny_siglip`) from
the tiny world's trained models (BLIP-2's frozen vision tower is the tiny BLIP's, SigLIP's locked image
tower the tiny retrieval CLIP's), so each is rebuilt when the tiny world changes: its marker
(``{cache}/tiny/<folder>.READY.json``) holds the tiny world's fingerprint and the judge's training settings, and its held-out quality
(:func:`adjcap.demo.quality.itm_accuracy`) and training log."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from adjcap.demo.tiny import READY
from adjcap.storage.io import atomic_write_json

JUDGE_DIRS = {"blip2_itm": "blip2-itm", "clip": "siglip"}
VERSION = 1


@dataclass(frozen=True)
class JudgeSettings:
    pool_images: int = 2000
    blip2_steps: int = 400
    blip2_batch: int = 64
    siglip_steps: int = 400
    siglip_batch: int = 128
    heldout_images: int = 200
    threads: int = 1


def judge_config(cache_dir: str | Path, family: str) -> dict[str, Any]:
    """The ``verifier`` settings that load the tiny judge of ``family`` (``adjcap/reproduce/demo.toml``,
    which maps a row's verifier onto it), paths under ``cache_dir``."""
    from adjcap.reproduce.plan import demo_mapping

    return {"family": family, **{k: v.replace("{cache}", str(cache_dir))
                                 for k, v in demo_mapping()["verifier"][family].items()}}


_OWN = {"blip2_itm": "blip2_", "clip": "siglip_"}  # the settings' prefix of each judge's own training


def _fingerprint(world: str, family: str, settings: JudgeSettings) -> str:
    """The tiny world's fingerprint and the settings this judge's build reads (not the other judge's)."""
    mine = {k: v for k, v in asdict(settings).items()
            if not any(k.startswith(p) for f, p in _OWN.items() if f != family)}
    doc = json.dumps({"v": VERSION, "world": world, "family": family, "settings": mine}, sort_keys=True)
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


def _world_fingerprint(tiny: Path) -> str:
    marker = tiny / READY
    if not marker.is_file():
        raise FileNotFoundError(f"{marker}: the tiny world is not built; build it first (adjcap.demo.tiny.build_tiny_world)")
    return json.loads(marker.read_text())["fingerprint"]


def _marker(tiny: Path, family: str) -> Path:
    """Beside the judge's folder, not in it: a folder's files are its identity (adjcap.engine.identity.content_id)."""
    return tiny / f"{JUDGE_DIRS[family]}.{READY}"


def judge_ready(cache_dir: str | Path, family: str, settings: JudgeSettings | None = None) -> bool:
    tiny = Path(cache_dir) / "tiny"
    marker = _marker(tiny, family)
    try:
        return json.loads(marker.read_text())["fingerprint"] == _fingerprint(_world_fingerprint(tiny), family,
                                                                          settings or JudgeSettings())
    except (OSError, ValueError, KeyError):
        return False


def build_tiny_judge(cache_dir: str | Path, family: str, seed: int = 42,
                     settings: JudgeSettings | None = None) -> Path:
    """Build (or reuse) the tiny judge of ``family`` ("blip2_itm" or "clip") under ``cache_dir/tiny``;
    the tiny world must be built. Returns its directory; ``READY.json`` is written last."""
    from adjcap.demo.quality import heldout_pool, itm_accuracy
    from adjcap.demo.train_base import CLIP_POOL, deterministic, render_pool
    from adjcap.models.roles import load_verifier
    from adjcap.config import VerifierCfg

    if family not in JUDGE_DIRS:
        raise ValueError(f"no tiny judge for verifier.family={family!r} (tiny judges: {', '.join(JUDGE_DIRS)})")
    s = settings or JudgeSettings()
    tiny = Path(cache_dir) / "tiny"
    out = tiny / JUDGE_DIRS[family]
    if judge_ready(cache_dir, family, s):
        return out
    world = _world_fingerprint(tiny)
    out.mkdir(parents=True, exist_ok=True)
    _marker(tiny, family).unlink(missing_ok=True)
    t0 = time.perf_counter()
    pool = render_pool(seed, s.pool_images, CLIP_POOL)
    if family == "blip2_itm":
        from adjcap.demo.tiny_blip2 import build_tiny_blip2, train_tiny_blip2

        build_tiny_blip2(out, tiny / "blip-itm", seed=seed)
        log = train_tiny_blip2(out, pool, seed=seed, steps=s.blip2_steps, batch=s.blip2_batch, threads=s.threads)
    else:
        from adjcap.demo.tiny_clip import TINY_CLIP_LARGE
        from adjcap.demo.tiny_siglip import build_tiny_siglip, train_tiny_siglip

        weights = build_tiny_siglip(out / "open_clip_model.safetensors", tiny / "retrieval-clip" / "open_clip_model.safetensors",
                                    TINY_CLIP_LARGE, seed=seed)
        log = train_tiny_siglip(weights, pool, seed=seed, steps=s.siglip_steps, batch=s.siglip_batch, threads=s.threads)
    with deterministic(seed, 1):
        judge = load_verifier(VerifierCfg(**judge_config(cache_dir, family)), "cpu")
        quality = itm_accuracy(judge, heldout_pool(seed, s.heldout_images), seed)
    atomic_write_json(_marker(tiny, family), {"fingerprint": _fingerprint(world, family, s), "family": family, "seed": seed,
                                    "training": log.as_dict(), "quality": quality,
                                    "seconds": round(time.perf_counter() - t0, 3)})
    return out

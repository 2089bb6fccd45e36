"""Training of the tiny world's models on the demo world: short, deterministic, CPU-only, pure torch.

The tiny models are small models of the real classes (see :mod:`adjcap.demo.tiny`). Random weights
make the demo run but retrieve at random and caption gibberish; these trainings (about a minute on
one CPU core, all together) make the demo show the method working:

* the open_clip model of IFCap's CLIP role: contrastive CLIP training (symmetric InfoNCE with the
  learnt temperature) on images of a separate rendered pool (:func:`adjcap.demo.world.iter_training_pairs`,
  pool "clip-train") paired with their captions;
* the retrieval encoder (the judge's CLIP, bigG's role): the same architecture, starting from the
  captioner's CLIP and trained further on the same pairs with one-word hard negatives in the image ->
  text logits (a swapped colour / object, a wrong count; :mod:`adjcap.demo.negatives`, as NegCLIP), so
  it is the stronger judge of caption-image fit, as bigG is against IFCap's ViT-B/32;
* the BLIP ITM verifier: binary matched / mismatched training of the ITM head (and the whole tiny
  model) on the same pool, with hard negatives (one-word swaps of colour, object or count, and captions
  of the most similar other scenes by CLIP text cosine), tokenised through
  :meth:`adjcap.models.blip.Verifier.tokenize` (LAVIS cleaning, [ENC] first token), plus BLIP's
  image-text contrastive loss on its unimodal features (without it the ITM head of a randomly
  initialised model stays at chance for hundreds of steps);
* IFCap, text-only as in IFCap (spec/ifcap.md section 7, simplified): input x = norm(norm(t) + eps),
  eps ~ N(0, 0.016 I), t the captioner CLIP's text feature of the caption; r = raw CLIP text features
  of the caption's 5 nearest other corpus captions (normalised text cosine); hard prompt from the
  caption's own nouns (demo lexicon), each dropped with p = 0.4; sequence [soft 10 ; hard ; caption]
  with cross-entropy on caption tokens only (the final "." included, so beam search stops); GPT-2
  and the mapping network trained jointly with AdamW.

Every trainer reads the random model its family's tiny builder saved, trains it and writes it back
in the same format, so the real loaders load the result exactly as before. Runs are deterministic:
a fixed seed, torch's deterministic algorithms, and a fixed intra-op thread count (restored after;
one thread by default, which also keeps the result independent of the host's core count).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from adjcap.demo.train_base import CLIP_POOL, TrainingPool, deterministic, render_pool
from adjcap.demo.train_blip import train_blip_itm
from adjcap.demo.train_clip import train_clip
from adjcap.demo.train_ifcap import train_ifcap
from adjcap.io import atomic_write_bytes
from adjcap.models.clip import load_dual_encoder
from adjcap.models.sources import OPEN_CLIP_CONFIG


@dataclass(frozen=True)
class TinyTrainSettings:
    """Sizes and schedules of the tiny-world trainings (defaults: the demo's; tests shrink them).

    ``retrieval_clip_steps`` = 0 copies the trained captioner CLIP into the retrieval role (both roles
    use the same architecture); > 0 trains that copy further with hard negatives (the stronger judge).
    The judges (retrieval CLIP, BLIP ITM) see paired images; IFCap sees text only."""

    pool_images: int = 2000
    clip_steps: int = 500
    clip_batch: int = 64
    clip_lr: float = 5e-3
    retrieval_clip_steps: int = 500
    retrieval_clip_lr: float = 3e-3
    blip_steps: int = 1000
    blip_batch: int = 64
    blip_lr: float = 5e-3
    blip_image_size: int = 64
    blip_swap_fraction: float = 0.4
    blip_count_fraction: float = 0.15
    blip_insert_fraction: float = 0.2
    blip_hard_fraction: float = 0.15
    ifcap_steps: int = 700
    ifcap_batch: int = 64
    ifcap_lr: float = 5e-3
    threads: int = 1

    def scaled(self, factor: float, pool_images: int | None = None) -> TinyTrainSettings:
        """The same settings with every step count multiplied by ``factor`` (at least 1 step; a
        zero stays zero)."""
        steps = {k: (max(1, int(round(getattr(self, k) * factor))) if getattr(self, k) else 0)
                 for k in ("clip_steps", "retrieval_clip_steps", "blip_steps", "ifcap_steps")}
        if pool_images is not None:
            steps["pool_images"] = int(pool_images)
        return replace(self, **steps)


# --------------------------------------------------------------------------------------------
# The whole tiny world
# --------------------------------------------------------------------------------------------


def _copy_clip(src: Path, dst: Path) -> None:
    """The trained CLIP file and its sidecar config, copied into another role's directory."""
    src, dst = Path(src), Path(dst)
    atomic_write_bytes(dst, src.read_bytes())
    atomic_write_bytes(dst.parent / OPEN_CLIP_CONFIG, (src.parent / OPEN_CLIP_CONFIG).read_bytes())


def scene_text_features(enc, pool: TrainingPool) -> torch.Tensor:
    """One unit vector per scene: the normalised mean of its captions' CLIP text embeddings."""
    caps = [c for cs in pool.captions for c in cs]
    per = len(pool.captions[0])
    feats = enc.encode_texts(caps, normalize=True).float().view(len(pool), per, -1).mean(1)
    return F.normalize(feats, dim=-1)


def available_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class _BlipApart:
    """The BLIP ITM training in a fresh interpreter (``python -m adjcap.demo.train``): the job (paths,
    numbers, the scene features) goes through a file, the pool is rendered again there (deterministic,
    well under a second), the log comes back through a file. A fresh interpreter, not multiprocessing,
    so nothing depends on the caller's ``__main__``."""

    def __init__(self, work: Path, blip_dir: Path, seed: int, pool_images: int, kwargs: dict[str, Any]) -> None:
        import adjcap

        self.job, self.result = work / "blip-job.pt", work / "blip-log.json"
        self.result.unlink(missing_ok=True)
        torch.save({"blip_dir": str(blip_dir), "seed": seed, "pool_images": pool_images, "kwargs": kwargs}, self.job)
        root = str(Path(adjcap.__file__).resolve().parent.parent)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
        self.proc = subprocess.Popen([sys.executable, "-m", "adjcap.demo.train", str(self.job)], env=env)

    def result_log(self) -> dict[str, Any]:
        rc = self.proc.wait()
        if rc != 0 or not self.result.is_file():
            raise RuntimeError(f"the BLIP judge's training (a separate process) failed with exit code {rc}; "
                               "its error is printed above")
        log = json.loads(self.result.read_text())
        self.job.unlink(missing_ok=True)
        self.result.unlink(missing_ok=True)
        return log

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _run_blip_job(job: Path) -> None:
    spec = torch.load(job, weights_only=False)
    pool = render_pool(spec["seed"], spec["pool_images"], CLIP_POOL)
    log = train_blip_itm(spec["blip_dir"], pool, seed=spec["seed"], **spec["kwargs"]).as_dict()
    atomic_write_bytes(job.parent / "blip-log.json", json.dumps(log).encode())


def train_tiny_world(
    paths: dict[str, Path],
    corpus_texts: Sequence[str],
    seed: int = 42,
    settings: TinyTrainSettings = TinyTrainSettings(),
    *,
    retrieval_model: str = "adjcap-tiny-clip",
    captioner_model: str = "adjcap-tiny-clip",
    mapping_heads: int = 2,
    workers: int | None = None,
) -> dict[str, Any]:
    """Train every model of a freshly built (random) tiny world in place; returns the training logs.

    After the captioner CLIP (which the others start from or read), the BLIP judge trains in a second
    process while this one trains the retrieval CLIP and then IFCap, when ``workers`` (default: the
    cores this process may use) is 2 or more. Every training is single-threaded and seeded on its
    own, so the files are byte-identical either way; only the wall time differs."""
    s = settings
    workers = available_cores() if workers is None else int(workers)
    t0, c0 = time.perf_counter(), time.process_time()
    pool = render_pool(seed, s.pool_images, CLIP_POOL)
    render_s = time.perf_counter() - t0
    logs: dict[str, Any] = {"render_seconds": round(render_s, 3), "settings": asdict(s)}
    logs["captioner_clip"] = train_clip(
        paths["captioner_clip"], pool, model=captioner_model, seed=seed + 1, steps=s.clip_steps,
        batch=s.clip_batch, lr=s.clip_lr, threads=s.threads).as_dict()
    if retrieval_model != captioner_model:
        raise ValueError(
            f"the retrieval CLIP starts from the captioner CLIP ({captioner_model}) but is configured as "
            f"{retrieval_model}; use one architecture for both roles")
    _copy_clip(paths["captioner_clip"], paths["retrieval_clip"])
    enc = load_dual_encoder(captioner_model, str(paths["captioner_clip"]), device="cpu", precision="fp32",
                            towers=("text",))
    with deterministic(seed, s.threads):
        scene_feats = scene_text_features(enc, pool)
    blip_kwargs = dict(
        steps=s.blip_steps, batch=s.blip_batch, lr=s.blip_lr, text_features=scene_feats,
        swap_fraction=s.blip_swap_fraction, count_fraction=s.blip_count_fraction,
        insert_fraction=s.blip_insert_fraction, hard_fraction=s.blip_hard_fraction, threads=s.threads)
    blip_job = None
    if workers >= 2:
        blip_job = _BlipApart(paths["blip"].parent, paths["blip"], seed, s.pool_images, blip_kwargs)
    try:
        if s.retrieval_clip_steps > 0:
            logs["retrieval_clip"] = train_clip(
                paths["retrieval_clip"], pool, model=retrieval_model, seed=seed, steps=s.retrieval_clip_steps,
                batch=s.clip_batch, lr=s.retrieval_clip_lr, hard_negatives=True, threads=s.threads).as_dict()
            logs["retrieval_clip"]["starts_from"] = "captioner_clip"
        else:
            logs["retrieval_clip"] = {"copy_of": "captioner_clip"}
        logs["ifcap"] = train_ifcap(
            paths["ifcap"].parent, paths["tokenizer"], paths["captioner_clip"], corpus_texts, seed=seed,
            steps=s.ifcap_steps, batch=s.ifcap_batch, lr=s.ifcap_lr, clip_model=captioner_model,
            mapping_heads=mapping_heads, threads=s.threads).as_dict()
        if blip_job is None:
            logs["blip"] = train_blip_itm(paths["blip"], pool, seed=seed, **blip_kwargs).as_dict()
        else:
            logs["blip"] = blip_job.result_log()
            logs["blip"]["process"] = "separate"
    finally:
        if blip_job is not None:
            blip_job.stop()
    logs["workers"] = min(workers, 2)
    logs["seconds"] = round(time.perf_counter() - t0, 3)
    logs["cpu_seconds"] = round(time.process_time() - c0, 3)  # this process only
    return logs


if __name__ == "__main__":  # the BLIP training of a parallel build (see _BlipApart)
    _run_blip_job(Path(sys.argv[1]))

"""Training of the tiny world's models on the demo world: short, deterministic, CPU-only, pure torch.

The tiny models are small models of the real classes (see :mod:`adjcap.demo.tiny`). Random weights
make the demo run but retrieve at random and caption gibberish; these trainings (about four minutes
of CPU, two minutes on two cores) make the demo show the method working:

* the open_clip model of IFCap's CLIP role: contrastive CLIP training (symmetric InfoNCE with the
  learnt temperature) on images of a separate rendered pool (:func:`adjcap.demo.world.iter_training_pairs`,
  pool "clip-train") paired with their captions;
* the retrieval encoder (the judge's CLIP, bigG's role): a finer open_clip (``adjcap-tiny-clip-large``:
  8-pixel patches where the captioner's CLIP has 16, as bigG/14 against IFCap's ViT-B/32) trained
  from its own random start on the same pairs, with one-word hard negatives in the image -> text
  logits (a swapped colour / object, a wrong count; :mod:`adjcap.demo.negatives`, as NegCLIP), so it
  is the stronger judge of caption-image fit;
* the BLIP ITM verifier: binary matched / mismatched training of the ITM head (and the whole tiny
  model) on the same pool, with hard negatives (one-word swaps of colour, object or count, and captions
  of the most similar other scenes by CLIP text cosine), tokenised through
  :meth:`adjcap.models.blip.Verifier.tokenize` (LAVIS cleaning, [ENC] first token), plus BLIP's
  image-text contrastive loss on its unimodal features (without it the ITM head of a randomly
  initialised model stays at chance for hundreds of steps);
* IFCap, text-only as in IFCap (the IFCap paper's training, simplified): input x = norm(norm(t) + eps),
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
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from adjcap.demo.train_base import CLIP_POOL, TrainingPool, deterministic, render_pool
from adjcap.demo.train_blip import train_blip_itm
from adjcap.demo.train_clip import train_clip
from adjcap.demo.train_ifcap import train_ifcap
from adjcap.demo.train_settings import TinyTrainSettings
from adjcap.storage.io import atomic_write_bytes
from adjcap.models.clip import load_dual_encoder


# --------------------------------------------------------------------------------------------
# The whole tiny world
# --------------------------------------------------------------------------------------------


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


_TRAINERS = {"clip": train_clip, "blip": train_blip_itm}  # what may train in a process of its own


def fresh_interpreter(module: str, job: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``python -m MODULE JOB`` in a fresh interpreter that imports this adjcap (``env``: default this
    process's environment). A fresh interpreter, not multiprocessing, so nothing depends on the caller's
    ``__main__`` and the child gets the environment from its start (:mod:`adjcap.machine.numerics`)."""
    root = str(Path(__file__).resolve().parents[2])  # the folder holding this adjcap package (adjcap/demo/train.py)
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    return subprocess.Popen([sys.executable, "-m", module, str(job)], env=env)


class _Apart:
    """One training in a fresh interpreter (``python -m adjcap.demo.train JOB``): the job (trainer,
    model path, numbers) goes through a file, the pool is rendered again there (deterministic, a few
    seconds at most), the log comes back through a file. A fresh interpreter, not multiprocessing,
    so nothing depends on the caller's ``__main__``."""

    def __init__(self, work: Path, role: str, trainer: str, path: Path, seed: int, pool_images: int,
                 kwargs: dict[str, Any]) -> None:
        self.role = role
        self.job, self.result = work / f"{role}-job.json", work / f"{role}-log.json"
        self.result.unlink(missing_ok=True)
        atomic_write_bytes(self.job, json.dumps({"trainer": trainer, "path": str(path), "seed": seed,
                                                 "pool_images": pool_images, "kwargs": kwargs}).encode())
        self.proc = fresh_interpreter("adjcap.demo.train", self.job)

    def result_log(self) -> dict[str, Any]:
        rc = self.proc.wait()
        if rc != 0 or not self.result.is_file():
            raise RuntimeError(f"training the {self.role} in a separate process failed with exit code {rc}; "
                               "its error is printed above")
        log = json.loads(self.result.read_text())
        self.job.unlink(missing_ok=True)
        self.result.unlink(missing_ok=True)
        return log | {"process": "separate"}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _run_job(job: Path) -> None:
    spec = json.loads(job.read_text())
    pool = render_pool(spec["seed"], spec["pool_images"], CLIP_POOL)
    log = _TRAINERS[spec["trainer"]](spec["path"], pool, seed=spec["seed"], **spec["kwargs"]).as_dict()
    atomic_write_bytes(job.with_name(job.name.replace("-job.json", "-log.json")), json.dumps(log).encode())


def train_tiny_world(
    paths: dict[str, Path],
    corpus_texts: Sequence[str],
    seed: int = 42,
    settings: TinyTrainSettings = TinyTrainSettings(),
    *,
    retrieval_model: str = "adjcap-tiny-clip-large",
    captioner_model: str = "adjcap-tiny-clip",
    mapping_heads: int = 2,
    workers: int | None = None,
) -> dict[str, Any]:
    """Train every model of a freshly built (random) tiny world in place; returns the training logs.

    The retrieval judge depends on nothing else: with ``workers`` (default: the cores this process may
    use) 2 or more it trains in a second process while this one trains the captioner CLIP, IFCap (on
    that CLIP) and the BLIP judge (its hard negatives ranked by that CLIP). Every training is
    single-threaded and seeded on its own, so the files are byte-identical either way; only the wall
    time differs."""
    s = settings
    workers = available_cores() if workers is None else int(workers)
    t0, c0 = time.perf_counter(), time.process_time()
    pool = render_pool(seed, s.pool_images, CLIP_POOL)
    render_s = time.perf_counter() - t0
    logs: dict[str, Any] = {"render_seconds": round(render_s, 3), "settings": asdict(s)}
    judge_kwargs = dict(model=retrieval_model, steps=s.retrieval_clip_steps, batch=s.clip_batch,
                        lr=s.retrieval_clip_lr, hard_negatives=True, threads=s.threads)
    judge = None
    if workers >= 2:
        judge = _Apart(paths["retrieval_clip"].parent, "retrieval CLIP", "clip", paths["retrieval_clip"], seed,
                       s.pool_images, judge_kwargs)
    try:
        logs["captioner_clip"] = train_clip(
            paths["captioner_clip"], pool, model=captioner_model, seed=seed + 1, steps=s.clip_steps,
            batch=s.clip_batch, lr=s.clip_lr, threads=s.threads).as_dict()
        logs["ifcap"] = train_ifcap(
            paths["ifcap"].parent, paths["tokenizer"], paths["captioner_clip"], corpus_texts, seed=seed,
            steps=s.ifcap_steps, batch=s.ifcap_batch, lr=s.ifcap_lr, clip_model=captioner_model,
            mapping_heads=mapping_heads, threads=s.threads).as_dict()
        enc = load_dual_encoder(captioner_model, str(paths["captioner_clip"]), device="cpu", precision="fp32",
                                towers=("text",))
        with deterministic(seed, s.threads):
            scene_feats = scene_text_features(enc, pool)
        logs["blip"] = train_blip_itm(
            paths["blip"], pool, seed=seed, steps=s.blip_steps, batch=s.blip_batch, lr=s.blip_lr,
            text_features=scene_feats, swap_fraction=s.blip_swap_fraction, count_fraction=s.blip_count_fraction,
            insert_fraction=s.blip_insert_fraction, hard_fraction=s.blip_hard_fraction,
            threads=s.threads).as_dict()
        if judge is None:
            logs["retrieval_clip"] = train_clip(paths["retrieval_clip"], pool, seed=seed, **judge_kwargs).as_dict()
        else:
            logs["retrieval_clip"] = judge.result_log()
    finally:
        if judge is not None:
            judge.stop()
    logs["workers"] = min(workers, 2)
    logs["seconds"] = round(time.perf_counter() - t0, 3)
    logs["cpu_seconds"] = round(time.process_time() - c0, 3)  # this process only
    return logs


if __name__ == "__main__":  # one training of a parallel build (see _Apart)
    _run_job(Path(sys.argv[1]))

"""The demo's second captioner family: a tiny ``BlipForConditionalGeneration`` (the ``hf`` family's class
of BLIP large captioning) trained on the demo world's rendered image-caption pairs, built on first use
by the tables that ask for it (``reproduce captioner-sweep --benchmark demo``), never by ``make demo``.

Training: image -> caption cross-entropy (teacher forcing, BLIP's own loss with its label smoothing) on
the rendered pool the judges see (:data:`adjcap.demo.train_base.CLIP_POOL`), one of each scene's five
captions per step, AdamW with a cosine schedule; deterministic (seeded, one thread). Unlike IFCap it sees
images, so it is a captioner of another family, not another IFCap."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from adjcap.demo.train_base import (CLIP_POOL, LossTrace, TrainingPool, TrainLog, adamw, cosine_lr, deterministic,
                                    render_pool, set_lr)
from adjcap.demo.tiny_hf_captioner import build_tiny_hf_captioner
from adjcap.storage.file_lock import holding
from adjcap.storage.io import atomic_write_json
from adjcap.models.blip import quiet_progress

FOLDER = "blip-caption"  # under {cache}/tiny: the demo mapping's captioner.hf.model
READY = "READY.json"


@dataclass(frozen=True)
class CaptionerTrainSettings:
    pool_images: int = 2000
    steps: int = 1000
    batch: int = 48
    lr: float = 3e-3
    image_size: int = 64
    hidden: int = 64
    layers: int = 2
    threads: int = 1


def train_blip_captioner(model_dir: str | os.PathLike, pool: TrainingPool, *, seed: int, steps: int, batch: int,
                         lr: float, weight_decay: float = 0.05, threads: int = 1) -> TrainLog:
    """Train the tiny BLIP captioner saved in ``model_dir`` on ``pool`` and save it back."""
    from transformers import AutoTokenizer, BlipForConditionalGeneration, BlipImageProcessor

    t0 = time.perf_counter()
    path = Path(model_dir)
    with deterministic(seed, threads):
        net = BlipForConditionalGeneration.from_pretrained(path)
        tok = AutoTokenizer.from_pretrained(path)
        proc = BlipImageProcessor.from_pretrained(path)
        pixels = proc(images=pool.images, return_tensors="pt")["pixel_values"]
        bos = net.config.text_config.bos_token_id
        opt = adamw(list(net.named_parameters()), lr, weight_decay)
        trace = LossTrace(steps)
        gen = torch.Generator().manual_seed(seed)
        net.train()
        for step in range(steps):
            set_lr(opt, cosine_lr(step, steps, lr))
            idx = torch.randint(len(pool), (batch,), generator=gen)
            pick = torch.randint(len(pool.captions[0]), (batch,), generator=gen)
            texts = [pool.captions[int(i)][int(j)] for i, j in zip(idx, pick)]
            enc = tok(texts, padding=True, truncation=True, max_length=40, return_tensors="pt")
            ids = enc.input_ids.clone()
            ids[:, 0] = bos  # BLIP's decoder starts at [DEC], as its generate does
            labels = ids.masked_fill(enc.attention_mask == 0, -100)
            loss = net(pixel_values=pixels[idx], input_ids=ids, attention_mask=enc.attention_mask, labels=labels).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            opt.step()
            trace.add(loss)
        net.eval()
        with quiet_progress():
            net.save_pretrained(path)
    return trace.log("blip-caption", time.perf_counter() - t0)


def ensure_tiny_captioner(cache: str | os.PathLike, corpus_texts: list[str], seed: int = 42,
                          settings: CaptionerTrainSettings = CaptionerTrainSettings()) -> Path:
    """``{cache}/tiny/blip-caption``: built and trained once (under a lock: parallel callers wait for one
    build), then reused; its ``READY.json`` holds the training log and the settings."""
    out = Path(cache) / "tiny" / FOLDER
    if (out / READY).is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with holding(out.parent / f".{FOLDER}.lock", wait=True):
        if (out / READY).is_file():
            return out
        s = settings
        t0, c0 = time.perf_counter(), time.process_time()
        build_tiny_hf_captioner(out, "blip", corpus_texts, seed=seed, image_size=s.image_size, patch_size=8,
                                hidden=s.hidden, layers=s.layers)
        pool = render_pool(seed + 7, s.pool_images, CLIP_POOL)
        log = train_blip_captioner(out, pool, seed=seed, steps=s.steps, batch=s.batch, lr=s.lr, threads=s.threads)
        doc: dict[str, Any] = {"training": log.as_dict(), "settings": s.__dict__, "seed": seed,
                               "seconds": round(time.perf_counter() - t0, 1),
                               "cpu_seconds": round(time.process_time() - c0, 1)}
        atomic_write_json(out / READY, doc)
        print(f"tiny BLIP captioner (second captioner family) trained: {doc['seconds']} s wall, "
              f"loss {log.loss_first:.2f} -> {log.loss_last:.2f} -> {out}")
        print(json.dumps(doc["training"]))
    return out

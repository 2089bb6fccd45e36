"""The tiny SigLIP judge (``verifier.family = "clip"`` on the demo world): open_clip's
``adjcap-tiny-sigmoid`` (a ``CustomTextCLIP`` with a learnt logit bias, a bidirectional text tower
pooled at its last token, as SigLIP's), saved like a hub snapshot (safetensors + ``open_clip_config.json``)
so :func:`adjcap.models.clip.load_dual_encoder` loads it exactly like a downloaded SigLIP.

Trained as SigLIP's locked-image variant (SigLiT): the image tower is the tiny retrieval CLIP's,
frozen (its outputs computed once for the training pool); the text tower, the scale and the bias learn
with the pairwise sigmoid loss (every image against every caption of the batch, plus one near-miss
negative of its own caption: a swapped colour or object, a wrong count, an added object;
:func:`adjcap.demo.negatives.hard_negative`)."""

from __future__ import annotations

import json
import math
import os
import random
import time
from pathlib import Path

import open_clip
import torch
import torch.nn.functional as F

from adjcap.demo.negatives import hard_negative
from adjcap.demo.tiny_clip import CONFIG_DIR  # registers the tiny configs with open_clip
from adjcap.demo.train_base import (EpochSampler, LossTrace, TrainLog, TrainingPool, adamw, cosine_lr, deterministic,
                                    set_lr)
from adjcap.storage.io import atomic_write_bytes, atomic_write_json
from adjcap.models.clip import load_dual_encoder, quiet_random_init
from adjcap.models.sources import OPEN_CLIP_CONFIG

TINY_SIGMOID = "adjcap-tiny-sigmoid"
assert (CONFIG_DIR / f"{TINY_SIGMOID}.json").is_file()


def _save(net: torch.nn.Module, path: Path, meta: dict) -> None:
    from safetensors.torch import save

    state = {k: v.detach().contiguous().clone() for k, v in net.state_dict().items()}
    atomic_write_bytes(path, save(state, metadata={"adjcap": json.dumps(meta, sort_keys=True)}))


def build_tiny_siglip(path: str | os.PathLike, image_tower: str | os.PathLike, image_model: str, seed: int = 42) -> Path:
    """Save ``adjcap-tiny-sigmoid`` at ``path`` (a ``*.safetensors``): random text tower, scale and bias
    (open_clip's SigLIP initialisation: bias -10), the image tower of the open_clip model saved at
    ``image_tower`` (architecture ``image_model``; the same vision layout), its preprocessing too."""
    path = Path(path)
    if path.suffix != ".safetensors":
        raise ValueError(f"{path}: give a *.safetensors path")
    path.parent.mkdir(parents=True, exist_ok=True)
    src = load_dual_encoder(image_model, str(image_tower), device="cpu", precision="fp32", towers=("image",))
    with torch.random.fork_rng(devices=[]), quiet_random_init():
        torch.manual_seed(seed)
        net = open_clip.create_model(TINY_SIGMOID, pretrained=None, precision="fp32", device="cpu")
    net.visual.load_state_dict(src.model.visual.state_dict(), strict=True)
    _save(net, path, {"model": TINY_SIGMOID, "seed": seed, "image_tower": image_model})
    pp = {k: v for k, v in src.preprocess_cfg.items()}
    pp = {k: (list(v) if isinstance(v, tuple) else v) for k, v in pp.items()}
    side = json.loads((Path(image_tower).parent / OPEN_CLIP_CONFIG).read_text()).get("preprocess_cfg", {})
    pp.update(side)  # the image tower's own (the tiny CLIPs squash)
    atomic_write_json(path.parent / OPEN_CLIP_CONFIG, {"model_name": TINY_SIGMOID,
                                                       "model_cfg": open_clip.get_model_config(TINY_SIGMOID),
                                                       "preprocess_cfg": pp})
    return path


def train_tiny_siglip(path: str | os.PathLike, pool: TrainingPool, *, seed: int, steps: int, batch: int = 128,
                      lr: float = 5e-3, weight_decay: float = 0.05, threads: int = 1) -> TrainLog:
    """Train the text tower, scale and bias of the model at ``path`` with the sigmoid loss against its
    frozen image tower on ``pool``, and write it back in place."""
    path = Path(path)
    t0 = time.perf_counter()
    enc = load_dual_encoder(TINY_SIGMOID, str(path), device="cpu", precision="fp32")
    net = enc.model
    n = len(pool)
    batch = min(batch, n)
    with deterministic(seed, threads):
        with torch.no_grad():
            img_all = F.normalize(torch.cat([net.visual(enc.preprocess(pool.images[s : s + 256]))
                                             for s in range(0, n, 256)]), dim=-1)
        per = len(pool.captions[0])
        tok = enc.tokenize([c for caps in pool.captions for c in caps]).ids
        rng = random.Random(f"adjcap-tiny-siglip:{seed}")
        negs = [hard_negative(caps, k, pool.scenes[i], rng) for i, caps in enumerate(pool.captions) for k in range(per)]
        has_neg = torch.tensor([x is not None for x in negs])
        neg_tok = enc.tokenize([x or "" for x in negs]).ids
        trainable = [(k, p) for k, p in net.named_parameters() if not k.startswith("visual.")]
        for _, p in trainable:
            p.requires_grad_(True)
        net.train()
        opt = adamw(trainable, lr, weight_decay)
        gen = torch.Generator().manual_seed(seed)
        trace = LossTrace(steps)
        batches = EpochSampler(n, batch, gen)
        signs = 2 * torch.eye(batch) - 1
        for step in range(steps):
            set_lr(opt, cosine_lr(step, steps, lr))
            idx = batches.next()
            tid = idx * per + torch.randint(0, per, (batch,), generator=gen)
            img = img_all[idx]
            txt = F.normalize(net.encode_text(torch.cat([tok[tid], neg_tok[tid]])), dim=-1)
            scale, bias = net.logit_scale.exp(), net.logit_bias
            logits = scale * img @ txt[:batch].T + bias
            loss = -F.logsigmoid(signs * logits).sum()
            near = -F.logsigmoid(-(scale * (img * txt[batch:]).sum(-1) + bias))
            loss = (loss + near[has_neg[tid]].sum()) / batch
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            with torch.no_grad():
                net.logit_scale.clamp_(0.0, math.log(100.0))
            trace.add(loss)
        net.eval()
        _save(net, path, {"model": TINY_SIGMOID, "seed": seed, "trained": {"images": n, "steps": steps,
                                                                           "batch": batch, "lr": lr}})
    return trace.log(TINY_SIGMOID, time.perf_counter() - t0, logit_scale=float(net.logit_scale.detach().exp()),
                     logit_bias=float(net.logit_bias.detach()))

"""Contrastive training of the tiny open_clip model (symmetric InfoNCE with the learnt temperature)
on rendered scenes paired with their captions; see :mod:`adjcap.demo.train`."""

from __future__ import annotations

import json
import math
import os
import random
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from open_clip.transformer import text_global_pool
from safetensors.torch import save

from adjcap.demo.negatives import hard_negative
from adjcap.demo.train_base import (CLIP_POOL, EpochSampler, LossTrace, TrainLog, TrainingPool, adamw, cosine_lr,
                                    deterministic, set_lr)
from adjcap.storage.io import atomic_write_bytes
from adjcap.models.clip import load_dual_encoder


# --------------------------------------------------------------------------------------------
# CLIP (open_clip)
# --------------------------------------------------------------------------------------------


class _TrainableText:
    """The open_clip text forward at the batch's real length (exact for causal argmax pooling, as
    :meth:`DualEncoder.encode_tokens`), with the token embedding frozen except for the rows of the
    tokens the corpus uses (a small delta table, folded back after training: a 49k-row embedding
    would otherwise dominate every optimiser step)."""

    def __init__(self, enc, used_ids: torch.Tensor) -> None:
        parts = enc.text_tower
        if parts is None or not parts.trim_exact:
            raise ValueError(f"{enc.model_name}: tiny CLIP training needs an open_clip native causal text tower")
        self.parts = parts
        emb = parts.token_embedding.weight
        emb.requires_grad_(False)
        self.used = used_ids
        self.remap = torch.zeros(emb.shape[0], dtype=torch.long)
        self.remap[used_ids] = torch.arange(len(used_ids))
        self.delta = torch.nn.Parameter(torch.zeros(len(used_ids), emb.shape[1]))

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        p = self.parts
        width = ids.shape[1]
        x = p.token_embedding(ids) + self.delta[self.remap[ids]]
        x = x + p.positional_embedding[:width]
        x = p.transformer(x, attn_mask=p.attn_mask[:width, :width])
        x = p.ln_final(x)
        x = text_global_pool(x, ids, p.pool_type, eos_token_id=p.eos_id)
        if isinstance(p.text_projection, torch.nn.Linear):
            return p.text_projection(x)
        return x @ p.text_projection

    @torch.no_grad()
    def fold(self) -> None:
        self.parts.token_embedding.weight[self.used] += self.delta


def _save_clip(net: torch.nn.Module, path: Path, meta: dict[str, Any]) -> None:
    state = {k: v.detach().contiguous().clone() for k, v in net.state_dict().items()}
    atomic_write_bytes(path, save(state, metadata={"adjcap": json.dumps(meta, sort_keys=True)}))


def train_clip(
    path: str | os.PathLike,
    pool: TrainingPool,
    *,
    model: str,
    seed: int,
    steps: int,
    batch: int = 64,
    lr: float = 5e-3,
    weight_decay: float = 0.05,
    hard_negatives: bool = False,
    threads: int = 1,
) -> TrainLog:
    """Train the open_clip model saved at ``path`` (by :func:`adjcap.demo.tiny_clip.build_tiny_clip`)
    contrastively on ``pool`` (each step: ``batch`` images, one of each image's captions drawn at
    random) and write it back in place (safetensors; the sidecar config is unchanged).

    ``hard_negatives``: each image's row of the image -> text logits also gets a one-word negative of
    its caption (a swapped colour / object or a wrong count, :mod:`adjcap.demo.negatives`; as NegCLIP
    does), so the encoder learns the fine distinctions a judge of captions needs."""
    path = Path(path)
    t0 = time.perf_counter()
    enc = load_dual_encoder(model, str(path), device="cpu", precision="fp32")
    n = len(pool)
    batch = min(batch, n)
    with deterministic(seed, threads):
        pixels = enc.preprocess(pool.images)
        tok = enc.tokenize([c for caps in pool.captions for c in caps])
        per = len(pool.captions[0])
        neg_tok, has_neg = None, None
        if hard_negatives:
            rng = random.Random(f"adjcap-tiny-clip-negatives:{seed}")
            negs = [hard_negative(caps, k, pool.scenes[i], rng) for i, caps in enumerate(pool.captions)
                    for k in range(per)]
            has_neg = torch.tensor([x is not None for x in negs])
            neg_tok = enc.tokenize([x or caps for x, caps in zip(negs, (c for cs in pool.captions for c in cs))])
        net = enc.model.train()
        for p in net.parameters():
            p.requires_grad_(True)
        used = torch.unique(tok.ids if neg_tok is None else torch.cat([tok.ids, neg_tok.ids]))
        text = _TrainableText(enc, used)
        named = [(k, p) for k, p in net.named_parameters() if p.requires_grad] + [("text_delta_embed", text.delta)]
        opt = adamw(named, lr, weight_decay)
        gen = torch.Generator().manual_seed(seed)
        trace = LossTrace(steps)
        batches = EpochSampler(n, batch, gen)
        labels = torch.arange(batch)
        max_scale = math.log(100.0)
        for step in range(steps):
            set_lr(opt, cosine_lr(step, steps, lr))
            idx = batches.next()
            tid = idx * per + torch.randint(0, per, (batch,), generator=gen)
            width = int(tok.lengths[tid].max())
            img = F.normalize(net.visual(pixels[idx]), dim=-1)
            txt = F.normalize(text(tok.ids[tid, :width]), dim=-1)
            logits = net.logit_scale.exp() * img @ txt.T
            i2t = logits
            if neg_tok is not None:
                nw = int(neg_tok.lengths[tid].max())
                neg = F.normalize(text(neg_tok.ids[tid, :nw]), dim=-1)
                extra = (net.logit_scale.exp() * (img * neg).sum(-1)).masked_fill(~has_neg[tid], float("-inf"))
                i2t = torch.cat([logits, extra[:, None]], dim=1)
            loss = (F.cross_entropy(i2t, labels) + F.cross_entropy(logits.T, labels)) / 2
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            with torch.no_grad():
                net.logit_scale.clamp_(0.0, max_scale)
            trace.add(loss)
        text.fold()
        net.eval()
        _save_clip(net, path, {"model": model, "seed": seed, "trained": {
            "pool": CLIP_POOL, "images": n, "steps": steps, "batch": batch, "lr": lr,
            "hard_negatives": hard_negatives}})
    return trace.log(model, time.perf_counter() - t0, logit_scale=float(net.logit_scale.detach().exp()))

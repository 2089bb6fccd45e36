"""Matched / mismatched training of the tiny BLIP ITM verifier (plus BLIP's image-text contrastive
loss); see :mod:`adjcap.demo.train`."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from adjcap.demo.train_base import (EpochSampler, LossTrace, TrainLog, TrainingPool, adamw, cosine_lr, deterministic,
                                    set_lr)
from adjcap.demo.negatives import count_negative, insert_negative, swap_negative
from adjcap.models.blip import load_verifier, quiet_progress

__all__ = ["count_negative", "insert_negative", "swap_negative", "train_blip_itm"]


# --------------------------------------------------------------------------------------------
# BLIP ITM
# --------------------------------------------------------------------------------------------

def train_blip_itm(
    blip_dir: str | os.PathLike,
    pool: TrainingPool,
    *,
    seed: int,
    steps: int,
    batch: int = 64,
    lr: float = 1e-3,
    weight_decay: float = 0.05,
    text_features: torch.Tensor | None = None,
    hard_k: int = 16,
    negatives: int = 1,
    swap_fraction: float = 0.3,
    count_fraction: float = 0.0,
    insert_fraction: float = 0.0,
    hard_fraction: float = 0.3,
    label_smoothing: float = 0.1,
    itc_weight: float = 1.0,
    itc_temperature: float = 0.07,
    threads: int = 1,
) -> TrainLog:
    """Train the tiny BLIP ITM model saved in ``blip_dir`` (by :func:`adjcap.demo.tiny_blip.build_tiny_blip`)
    on matched / mismatched pairs and save it back (save_pretrained).

    Each step takes ``batch`` images with one of their captions (label 1) and one mismatched caption
    (label 0): half of the negatives are a caption of one of the ``hard_k`` scenes whose captions are
    most similar (``text_features``: one unit vector per scene, e.g. the mean CLIP text embedding of its
    captions; random other scenes without it) among those with different content, half the positive
    caption with one colour / object word swapped for one absent from the scene. Text goes through
    :meth:`Verifier.tokenize` ([ENC] first token, LAVIS cleaning, 35 tokens). Label smoothing keeps the
    match probabilities strictly inside (0, 1). As in BLIP's pre-training, the image-text contrastive
    loss on the unimodal features (``vision_proj`` / ``text_proj``, [CLS] text) is added with weight
    ``itc_weight``: from a random start the ITM head alone sits at chance for a long time.
    """
    t0 = time.perf_counter()
    ver = load_verifier(str(blip_dir), device="cpu", precision="fp32")
    net = ver.model
    n = len(pool)
    batch = min(batch, n)
    with deterministic(seed, threads):
        pixels = ver.preprocess(pool.images)
        rng = random.Random(f"adjcap-tiny-blip:{seed}")
        sigs = [pool.signature(i) for i in range(n)]
        if text_features is not None and n > 1:
            codes = {sig: k for k, sig in enumerate(sorted(set(sigs)))}
            code = torch.tensor([codes[sig] for sig in sigs])
            sim = (text_features @ text_features.T).masked_fill(code[:, None] == code[None, :], -2.0)
            hard = sim.topk(min(hard_k, n - 1), dim=1).indices.tolist()
        else:
            hard = [[j for j in range(n) if j != i] for i in range(n)]
        per = len(pool.captions[0])
        net.train()
        for p in net.parameters():
            p.requires_grad_(True)
        named = list(net.named_parameters())
        opt = adamw(named, lr, weight_decay)
        gen = torch.Generator().manual_seed(seed)
        trace = LossTrace(steps)
        batches = EpochSampler(n, batch, gen)
        k = max(1, int(negatives))
        labels = torch.cat([torch.ones(batch, dtype=torch.long), torch.zeros(batch * k, dtype=torch.long)])
        class_weight = torch.tensor([1.0, float(k)])  # as many positive as negative weight
        b = batch
        arange = torch.arange(b)
        cls_id = int(ver.tokenizer.cls_token_id)

        def negative(i: int, cap: str) -> str:
            u = rng.random()
            neg = swap_negative(cap, pool.scenes[i], rng) if u < swap_fraction else None
            if neg is None and swap_fraction <= u < swap_fraction + count_fraction:
                neg = count_negative(pool.captions[i], pool.scenes[i], rng)
            lo = swap_fraction + count_fraction
            if neg is None and lo <= u < lo + insert_fraction:
                neg = insert_negative(cap, pool.scenes[i], rng)
            if neg is None:
                if u < lo + insert_fraction + hard_fraction:
                    j = rng.choice(hard[i])
                else:
                    j = rng.randrange(n - 1)
                    j = j + 1 if j >= i else j
                neg = pool.captions[j][rng.randrange(per)]
            return neg

        for step in range(steps):
            set_lr(opt, cosine_lr(step, steps, lr))
            idx = batches.next().tolist()
            texts_pos = [pool.captions[i][rng.randrange(per)] for i in idx]
            texts_neg = [negative(i, cap) for _ in range(k) for i, cap in zip(idx, texts_pos)]
            ids, mask = ver.pad(ver.tokenize(texts_pos + texts_neg))
            image_embeds = net.vision_model(pixel_values=pixels[idx]).last_hidden_state
            image_atts = torch.ones((ids.shape[0], image_embeds.shape[1]), dtype=torch.long)
            hidden = net.text_encoder(
                input_ids=ids, attention_mask=mask,
                encoder_hidden_states=image_embeds.repeat(k + 1, 1, 1), encoder_attention_mask=image_atts,
            ).last_hidden_state
            logits = net.itm_head(hidden[:, 0, :])
            loss = F.cross_entropy(logits, labels, weight=class_weight, label_smoothing=label_smoothing)
            if itc_weight > 0:
                # BLIP's image-text contrastive loss on the unimodal features ([CLS] text, no image)
                cls_ids = ids[:b].clone()
                cls_ids[:, 0] = cls_id
                text_cls = net.text_encoder(input_ids=cls_ids, attention_mask=mask[:b]).last_hidden_state[:, 0]
                tf = F.normalize(net.text_proj(text_cls), dim=-1)
                vf = F.normalize(net.vision_proj(image_embeds[:b, 0]), dim=-1)
                sim = vf @ tf.T / itc_temperature
                loss = loss + itc_weight * (F.cross_entropy(sim, arange) + F.cross_entropy(sim.T, arange)) / 2
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            trace.add(loss)
        net.eval()
        for p in net.parameters():
            p.requires_grad_(False)
        with quiet_progress():
            net.save_pretrained(Path(blip_dir))
    return trace.log("blip-itm", time.perf_counter() - t0)

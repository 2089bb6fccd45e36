"""The tiny BLIP-2 ITM judge (``verifier.family = "blip2_itm"`` on the demo world): a small
``Blip2ForImageTextRetrieval`` trained the way BLIP-2's first stage is, saved with ``save_pretrained``
so :func:`adjcap.models.blip2.load_blip2_verifier` loads the directory exactly like a hub id.

BLIP-2 learns a Q-Former against a frozen, already trained image encoder (EVA ViT-g). Here the frozen
image encoder is the tiny BLIP judge's vision tower (the same ViT layout: its weights load into
``Blip2VisionModel`` name for name); the Q-Former (learnt query tokens, self-attention shared with the
text, cross-attention to the image every other layer) starts, as BLIP-2's starts from BERT, from the
tiny BLIP's text encoder (its query feed-forward from the text one; the query tokens random), and the
tokenizer is the tiny BLIP's WordPiece. Only the Q-Former side trains, with BLIP-2's image-text contrastive loss
(the best of the queries against the text's [CLS]) and its image-text matching loss on matched pairs
and mismatched ones (one-word near misses of the scene, :func:`adjcap.demo.negatives.hard_negative`,
and captions of other scenes). The frozen tower's outputs are computed once for the training pool."""

from __future__ import annotations

import json
import os
import random
import re
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from adjcap.demo.negatives import hard_negative
from adjcap.demo.train_base import (EpochSampler, LossTrace, TrainLog, TrainingPool, adamw, cosine_lr, deterministic,
                                    set_lr)
from adjcap.models.blip import quiet_progress


def build_tiny_blip2(out_dir: str | os.PathLike, blip_dir: str | os.PathLike, seed: int = 42, queries: int = 8,
                     layers: int = 2) -> Path:
    """Save a tiny ``Blip2ForImageTextRetrieval`` into ``out_dir``: the vision tower, tokenizer and image
    processor of the tiny BLIP ITM model in ``blip_dir``, a random Q-Former of the same width."""
    from transformers import AutoTokenizer, Blip2Config, Blip2ForImageTextRetrieval, BlipForImageTextRetrieval
    from transformers import BlipImageProcessor

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with quiet_progress():
        blip = BlipForImageTextRetrieval.from_pretrained(str(blip_dir))
    tok = AutoTokenizer.from_pretrained(str(blip_dir))
    v = blip.config.vision_config
    hidden = v.hidden_size
    config = Blip2Config(
        vision_config=dict(hidden_size=hidden, intermediate_size=v.intermediate_size, num_hidden_layers=v.num_hidden_layers,
                           num_attention_heads=v.num_attention_heads, image_size=v.image_size, patch_size=v.patch_size,
                           hidden_act=v.hidden_act, layer_norm_eps=v.layer_norm_eps),
        qformer_config=dict(vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers,
                            num_attention_heads=max(1, hidden // 16), intermediate_size=hidden * 2,
                            encoder_hidden_size=hidden, max_position_embeddings=64, pad_token_id=tok.pad_token_id,
                            use_qformer_text_input=True),  # the text feed-forward of the ITM checkpoints
        num_query_tokens=queries, image_text_hidden_size=hidden // 2,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = Blip2ForImageTextRetrieval(config)
    net.vision_model.load_state_dict(blip.vision_model.state_dict(), strict=True)
    _start_from_blip(net, blip)
    net.eval()
    with quiet_progress():
        net.save_pretrained(out)
    BlipImageProcessor.from_pretrained(str(blip_dir)).save_pretrained(out)
    tok.save_pretrained(out)
    (out / "adjcap_tiny.json").write_text(json.dumps({"family": "blip2-itm", "seed": seed, "vision": "tiny blip-itm"}) + "\n")
    return out


def blip_source_key(key: str) -> str | None:
    """The tiny BLIP ITM tensor a Q-Former-side tensor starts from (BLIP-2 starts its Q-Former from a
    trained BERT: here the tiny BLIP's text encoder; the query feed-forward copies the text one), or None."""
    rules = ((r"^embeddings\.", "text_encoder.embeddings."), (r"^qformer\.layernorm\.", "text_encoder.embeddings.LayerNorm."),
             (r"^qformer\.encoder\.layer\.(\d+)\.(attention|crossattention)\.attention\.",
              r"text_encoder.encoder.layer.\1.\2.self."),
             (r"^qformer\.encoder\.layer\.(\d+)\.(attention|crossattention)\.output\.",
              r"text_encoder.encoder.layer.\1.\2.output."),
             (r"^qformer\.encoder\.layer\.(\d+)\.(intermediate|output)(_query)?\.", r"text_encoder.encoder.layer.\1.\2."),
             (r"^vision_projection\.", "vision_proj."), (r"^text_projection\.", "text_proj."), (r"^itm_head\.", "itm_head."))
    for pattern, repl in rules:
        if re.match(pattern, key):
            return re.sub(pattern, repl, key)
    return None


def _start_from_blip(net, blip) -> None:
    src = blip.state_dict()
    with torch.no_grad():
        for key, t in net.state_dict().items():
            name = blip_source_key(key)
            if name is not None and name in src and src[name].shape == t.shape:
                t.copy_(src[name])


def train_tiny_blip2(blip2_dir: str | os.PathLike, pool: TrainingPool, *, seed: int, steps: int, batch: int = 64,
                     lr: float = 2e-3, weight_decay: float = 0.05, near_miss: float = 0.6,
                     itc_temperature: float = 0.07, threads: int = 1) -> TrainLog:
    """Train the Q-Former side of the model in ``blip2_dir`` (vision tower frozen) on ``pool`` and save
    it back. Each step: ``batch`` images with one of their captions (ITM label 1, ITC positives) and
    one mismatched caption each (label 0): a near miss with probability ``near_miss``, else another
    scene's caption."""
    from adjcap.models.blip2 import load_blip2_verifier

    t0 = time.perf_counter()
    ver = load_blip2_verifier(str(blip2_dir), device="cpu", precision="fp32")
    net = ver.model
    n = len(pool)
    batch = min(batch, n)
    with deterministic(seed, threads):
        with torch.no_grad():
            image_embeds = torch.cat([net.vision_model(pixel_values=ver.preprocess(pool.images[s : s + 256]))[0]
                                      for s in range(0, n, 256)])
        rng = random.Random(f"adjcap-tiny-blip2:{seed}")
        per = len(pool.captions[0])
        trainable = [(k, p) for k, p in net.named_parameters() if not k.startswith("vision_model.")]
        for _, p in trainable:
            p.requires_grad_(True)
        net.train()
        opt = adamw(trainable, lr, weight_decay)
        gen = torch.Generator().manual_seed(seed)
        trace = LossTrace(steps)
        batches = EpochSampler(n, batch, gen)
        labels = torch.cat([torch.ones(batch, dtype=torch.long), torch.zeros(batch, dtype=torch.long)])
        arange = torch.arange(batch)

        def negative(i: int, k: int) -> str:
            neg = hard_negative(pool.captions[i], k, pool.scenes[i], rng) if rng.random() < near_miss else None
            if neg is None:
                j = (i + 1 + rng.randrange(n - 1)) % n
                neg = pool.captions[j][rng.randrange(per)]
            return neg

        for step in range(steps):
            set_lr(opt, cosine_lr(step, steps, lr))
            idx = batches.next()
            ks = [rng.randrange(per) for _ in range(batch)]
            texts_pos = [pool.captions[int(i)][k] for i, k in zip(idx, ks)]
            texts_neg = [negative(int(i), k) for i, k in zip(idx, ks)]
            ids, mask = ver.pad(ver.tokenize(texts_pos + texts_neg))
            img = image_embeds[idx]
            logits = ver.itm_logits(img.repeat(2, 1, 1), ids, mask)
            loss = F.cross_entropy(logits, labels)
            # BLIP-2's image-text contrastive loss: the best query against the text's [CLS] (the model's ITC branch)
            query = net.query_tokens.expand(batch, -1, -1)
            q_out = net.qformer(query_embeds=query, encoder_hidden_states=img,
                                encoder_attention_mask=torch.ones(img.shape[:-1], dtype=torch.long)).last_hidden_state
            t_out = net.qformer(query_embeds=net.embeddings(input_ids=ids[:batch]), query_length=0,
                                attention_mask=mask[:batch]).last_hidden_state
            iq = F.normalize(net.vision_projection(q_out), dim=-1)
            tf = F.normalize(net.text_projection(t_out[:, 0]), dim=-1)
            sim = torch.einsum("iqd,td->itq", iq, tf).max(dim=-1).values / itc_temperature
            loss = loss + (F.cross_entropy(sim, arange) + F.cross_entropy(sim.T, arange)) / 2
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            trace.add(loss)
        net.eval()
        for p in net.parameters():
            p.requires_grad_(False)
        with quiet_progress():
            net.save_pretrained(Path(blip2_dir))
    return trace.log("blip2-itm", time.perf_counter() - t0)

"""Text-only training of the tiny IFCap, as IFCap is trained (the IFCap paper's training, simplified);
see :mod:`adjcap.demo.train`."""

from __future__ import annotations

import math
import os
import random
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F

from adjcap.demo.tiny_ifcap import with_gpt2_mask_buffers
from adjcap.demo.train_base import LossTrace, TrainLog, adamw, cosine_lr, deterministic, set_lr
from adjcap.demo.world import demo_lexicon
from adjcap.models.entities import NOUN_TAGS, hard_prompt, lexicon_tagger
from adjcap.models.clip import load_dual_encoder
from adjcap.models.gpt2_tokenizer import load_gpt2_tokenizer
from adjcap.models.ifcap import ClipCaptionModel, gpt2_config, infer_mapping_dims

IFCAP_NOISE_VARIANCE = 0.016  # IFCap's --noise_variance (spec 7)
IFCAP_NEIGHBOURS = 5
ENTITY_DROP = 0.4  # IFCap's random_mask (spec 7, step 4)
MAX_ENTITIES = 10
# spec 7 step 3: the extra words IFCap's training filter removes (the demo lexicon has no stop words)
TRAIN_ENTITY_STOP = frozenset({"photo", "image", "picture", "pic", "side", "part", "background"})


# --------------------------------------------------------------------------------------------
# IFCap (text-only training)
# --------------------------------------------------------------------------------------------


def caption_entities(caption: str, tagger, lemmatize) -> list[str]:
    """IFCap's training entities of one caption before the random drop (spec 7, steps 1-3 with the
    demo lexicon as tagger): its noun lemmas in order of first occurrence, without IFCap's extra stop
    words, de-duplicated, at most 10."""
    seen: list[str] = []
    for token, tag in tagger(caption):
        if tag not in NOUN_TAGS:
            continue
        lemma = lemmatize(token.lower().strip())
        if len(lemma) > 1 and lemma not in TRAIN_ENTITY_STOP and lemma not in seen:
            seen.append(lemma)
    return seen[:MAX_ENTITIES]


def drop_entities(entities: Sequence[str], rng: random.Random, drop: float = ENTITY_DROP) -> list[str]:
    """Spec 7 steps 4-5: each entity dropped with probability ``drop``; the rest in random order."""
    kept = [e for e in entities if rng.random() >= drop]
    rng.shuffle(kept)
    return kept


def training_entities(caption: str, tagger, lemmatize, rng: random.Random, drop: float = ENTITY_DROP) -> list[str]:
    """IFCap's training hard-prompt entities for one caption: :func:`caption_entities` then
    :func:`drop_entities`."""
    return drop_entities(caption_entities(caption, tagger, lemmatize), rng, drop)


def _length_buckets(lengths: torch.Tensor, batch: int, gen: torch.Generator, window: int = 16) -> list[torch.Tensor]:
    """One epoch of batches (the last one, if short, is dropped): a random permutation cut into windows
    of ``window`` batches, each window sorted by length and cut into batches, the batches in random
    order (little padding, every example once per epoch). Returned reversed, to be popped."""
    n = len(lengths)
    perm = torch.randperm(n, generator=gen)
    out: list[torch.Tensor] = []
    span = batch * window
    for start in range(0, n - batch + 1, span):
        chunk = perm[start : start + span]
        chunk = chunk[torch.argsort(lengths[chunk], stable=True)]
        out.extend(chunk[b : b + batch] for b in range(0, len(chunk) - batch + 1, batch))
    order = torch.randperm(len(out), generator=gen).tolist()
    return [out[i] for i in order]


def train_ifcap(
    ifcap_dir: str | os.PathLike,
    tokenizer_dir: str | os.PathLike,
    clip_path: str | os.PathLike,
    corpus_texts: Sequence[str],
    *,
    seed: int,
    steps: int,
    batch: int = 64,
    lr: float = 3e-3,
    weight_decay: float = 0.01,
    clip_model: str = "adjcap-tiny-clip",
    mapping_heads: int = 2,
    lexicon: dict[str, list[str]] | None = None,
    noise_variance: float = IFCAP_NOISE_VARIANCE,
    threads: int = 1,
) -> TrainLog:
    """Train the tiny IFCap saved in ``ifcap_dir`` (by :func:`adjcap.demo.tiny_ifcap.build_tiny_ifcap`:
    ``tiny-ifcap.pt`` + ``config.json``) text-only on ``corpus_texts`` with the CLIP at ``clip_path``
    (the captioner's CLIP) and write it back in the released files' layout (official key names, the
    GPT-2 mask buffers, lm_head tied to wte), so :func:`load_ifcap` loads it unchanged.

    The model starts from a fresh standard initialisation (GPT-2's), not from the builder's
    decode-like random init."""
    t0 = time.perf_counter()
    out = Path(ifcap_dir)
    pt = out / "tiny-ifcap.pt"
    texts = [t for t in corpus_texts if t]
    if len(texts) < IFCAP_NEIGHBOURS + 1:
        raise ValueError(f"IFCap training needs at least {IFCAP_NEIGHBOURS + 1} corpus captions, got {len(texts)}")
    tok = load_gpt2_tokenizer(str(tokenizer_dir))
    cfg = gpt2_config(str(out))
    dims = infer_mapping_dims(torch.load(pt, weights_only=True, map_location="cpu"), str(pt))
    clip = load_dual_encoder(clip_model, str(clip_path), device="cpu", precision="fp32", towers=("text",))
    if clip.embed_dim != dims.clip_dim:
        raise ValueError(f"{clip_path}: CLIP embed dim {clip.embed_dim} != IFCap mapping input {dims.clip_dim}")
    tagger, lemmatize = lexicon_tagger(lexicon if lexicon is not None else demo_lexicon())
    with deterministic(seed, threads):
        raw = clip.encode_texts(texts, normalize=False).float()
        unit = F.normalize(raw, dim=-1)
        sim = unit @ unit.T
        sim.fill_diagonal_(-2.0)
        neighbours = sim.topk(IFCAP_NEIGHBOURS, dim=1).indices  # [N, 5], excluding the caption itself
        del sim
        cap_ids = [tok.encode(t, add_special_tokens=False) for t in texts]
        nouns = [caption_entities(t, tagger, lemmatize) for t in texts]
        model = ClipCaptionModel(cfg, dims, mapping_heads)
        model.eval()  # no dropout; gradients flow as usual
        wte = model.gpt.transformer.wte
        named = list(model.named_parameters())
        opt = adamw(named, lr, weight_decay)
        rng = random.Random(f"adjcap-tiny-ifcap:{seed}")
        gen = torch.Generator().manual_seed(seed)
        trace = LossTrace(steps)
        n = len(texts)
        batch = min(batch, n)
        lengths = torch.tensor([len(c) for c in cap_ids])
        batches: list[torch.Tensor] = []
        prompt_cache: dict[tuple[str, ...], list[int]] = {}
        soft_len = dims.prefix_length
        std = math.sqrt(noise_variance)
        for step in range(steps):
            set_lr(opt, cosine_lr(step, steps, lr))
            if not batches:
                batches = _length_buckets(lengths, batch, gen)
            idx = batches.pop()
            x = unit[idx] + std * torch.randn(len(idx), unit.shape[1], generator=gen)
            x = F.normalize(x, dim=-1)
            r = raw[neighbours[idx]]
            soft = model.mapping_network(x, r)  # [B, 10, D]
            hards, caps = [], []
            for i in idx.tolist():
                ents = tuple(drop_entities(nouns[i], rng))
                if ents not in prompt_cache:
                    prompt_cache[ents] = tok.encode(hard_prompt(list(ents)), add_special_tokens=False)
                hards.append(prompt_cache[ents])
                caps.append(cap_ids[i])
            width = soft_len + max(len(h) + len(c) for h, c in zip(hards, caps))
            ids = torch.zeros(len(idx), width - soft_len, dtype=torch.long)
            attn = torch.zeros(len(idx), width, dtype=torch.long)
            target = torch.full((len(idx), width), -100, dtype=torch.long)
            for b, (h, c) in enumerate(zip(hards, caps)):
                seq = h + c
                ids[b, : len(seq)] = torch.tensor(seq)
                attn[b, : soft_len + len(seq)] = 1
                # the logits at position p predict the token at p + 1: caption tokens only
                start = soft_len + len(h)
                target[b, start - 1 : start - 1 + len(c)] = torch.tensor(c)
            emb = torch.cat([soft, wte(ids)], dim=1)
            hidden = model.gpt.transformer(inputs_embeds=emb, attention_mask=attn).last_hidden_state
            # the LM head on the caption positions only (the others carry no loss)
            at = target >= 0
            logits = model.gpt.lm_head(hidden[at])
            loss = F.cross_entropy(logits, target[at])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            trace.add(loss)
        model.eval()
        sd = OrderedDict((k, v.detach().clone()) for k, v in model.state_dict().items())
        sd = with_gpt2_mask_buffers(sd, cfg.n_layer, cfg.n_positions)
        sd["gpt.lm_head.weight"] = sd["gpt.transformer.wte.weight"]
        tmp = pt.with_suffix(".pt.tmp")
        torch.save(sd, tmp)
        os.replace(tmp, pt)
    return trace.log("ifcap", time.perf_counter() - t0)

"""Training of the tiny world's models on the demo world: short, deterministic, CPU-only, pure torch.

The tiny models are small models of the real classes (see :mod:`adjcap.demo.tiny`). Random weights
make the demo run but retrieve at random and caption gibberish; these trainings (about a minute on
one CPU core, all together) make the demo show the method working:

* the open_clip model of IFCap's CLIP role: contrastive CLIP training (symmetric InfoNCE with the
  learnt temperature) on images of a separate rendered pool (:func:`adjcap.demo.world.iter_training_pairs`,
  pool "clip-train") paired with their captions. The retrieval role has the same architecture and by
  default gets a copy (``TinyTrainSettings.retrieval_clip_steps`` > 0 trains its own, another seed);
* the BLIP ITM verifier: binary matched / mismatched training of the ITM head (and the whole tiny
  model) on the same pool, with hard-ish negatives (captions of the most similar other scenes by CLIP
  text cosine, and captions with one colour or object word swapped for one absent from the scene),
  tokenised through :meth:`adjcap.models.blip.Verifier.tokenize` (LAVIS cleaning, [ENC] first token),
  plus BLIP's image-text contrastive loss on its unimodal features (without it the ITM head of a
  randomly initialised model stays at chance for hundreds of steps);
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

import contextlib
import json
import math
import os
import random
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from open_clip.transformer import text_global_pool
from safetensors.torch import save

from adjcap.data.corpus import normalize_caption
from adjcap.demo.tiny_ifcap import with_gpt2_mask_buffers
from adjcap.demo.world import COLOURS, OBJECTS, demo_lexicon, iter_training_pairs
from adjcap.entities import NOUN_TAGS, hard_prompt, lexicon_tagger
from adjcap.io import atomic_write_bytes
from adjcap.models.blip import load_verifier, quiet_progress
from adjcap.models.clip import load_dual_encoder
from adjcap.models.gpt2_tokenizer import load_gpt2_tokenizer
from adjcap.models.ifcap import ClipCaptionModel, gpt2_config, infer_mapping_dims
from adjcap.models.sources import OPEN_CLIP_CONFIG

__all__ = [
    "CLIP_POOL",
    "HELDOUT_POOL",
    "IFCAP_NOISE_VARIANCE",
    "TinyTrainSettings",
    "TrainLog",
    "TrainingPool",
    "deterministic",
    "render_pool",
    "caption_entities",
    "drop_entities",
    "scene_text_features",
    "train_blip_itm",
    "train_clip",
    "train_ifcap",
    "train_tiny_world",
    "training_entities",
]

CLIP_POOL = "clip-train"
HELDOUT_POOL = "clip-heldout"
IFCAP_NOISE_VARIANCE = 0.016  # IFCap's --noise_variance (spec 7)
IFCAP_NEIGHBOURS = 5
ENTITY_DROP = 0.4  # IFCap's random_mask (spec 7, step 4)
MAX_ENTITIES = 10
# spec 7 step 3: the extra words IFCap's training filter removes (the demo lexicon has no stop words)
TRAIN_ENTITY_STOP = frozenset({"photo", "image", "picture", "pic", "side", "part", "background"})


@dataclass(frozen=True)
class TinyTrainSettings:
    """Sizes and schedules of the tiny-world trainings (defaults: the demo's; tests shrink them).

    ``retrieval_clip_steps`` = 0 copies the trained captioner CLIP into the retrieval role (both roles
    use the same architecture); > 0 trains the retrieval CLIP separately (another seed)."""

    pool_images: int = 2000
    clip_steps: int = 800
    clip_batch: int = 64
    clip_lr: float = 5e-3
    retrieval_clip_steps: int = 0
    blip_steps: int = 300
    blip_batch: int = 64
    blip_lr: float = 5e-3
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


@dataclass
class TrainLog:
    """What one training did: steps, seconds, mean loss over the first and the last tenth of steps."""

    model: str
    steps: int
    seconds: float
    loss_first: float
    loss_last: float
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class _LossTrace:
    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.values: list[float] = []

    def add(self, loss: torch.Tensor) -> None:
        self.values.append(float(loss.detach()))

    def log(self, model: str, seconds: float, **extra: Any) -> TrainLog:
        n = max(1, len(self.values) // 10)
        first = sum(self.values[:n]) / n if self.values else math.nan
        last = sum(self.values[-n:]) / n if self.values else math.nan
        return TrainLog(model, len(self.values), round(seconds, 3), first, last, extra)


# --------------------------------------------------------------------------------------------
# Determinism
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def deterministic(seed: int, threads: int = 1) -> Iterator[None]:
    """Seed torch's global RNG (restored after), switch on deterministic algorithms and fix the
    intra-op thread count for the duration; the previous state comes back on exit."""
    prev_threads = torch.get_num_threads()
    prev_det = torch.are_deterministic_algorithms_enabled()
    prev_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        torch.set_num_threads(max(1, int(threads)))
        torch.use_deterministic_algorithms(True, warn_only=True)
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(prev_det, warn_only=prev_warn)
            torch.set_num_threads(prev_threads)


def _cosine_lr(step: int, steps: int, base: float, warmup_frac: float = 0.1) -> float:
    warm = max(1, int(steps * warmup_frac))
    if step < warm:
        return base * (step + 1) / warm
    return base * 0.5 * (1.0 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))


def _set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    for group in opt.param_groups:
        group["lr"] = lr


def _adamw(named: Sequence[tuple[str, torch.nn.Parameter]], lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on biases, norms, embeddings, scales)."""
    decay = [p for n, p in named if p.dim() >= 2 and "embed" not in n and "wte" not in n and "wpe" not in n]
    ids = {id(p) for p in decay}
    rest = [p for _, p in named if id(p) not in ids]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}],
        lr=lr, betas=(0.9, 0.98), eps=1e-6, foreach=False,
    )


# --------------------------------------------------------------------------------------------
# The rendered training pool
# --------------------------------------------------------------------------------------------


@dataclass
class TrainingPool:
    """Rendered demo scenes (images in memory) with their 5 captions, normalised as the corpus is."""

    images: list[Any]  # PIL images
    captions: list[list[str]]
    scenes: list[dict[str, Any]]

    def __len__(self) -> int:
        return len(self.images)

    def signature(self, i: int) -> tuple:
        """The scene's content (background, sorted (colour, kind) list): equal signatures = same content."""
        sc = self.scenes[i]
        return (sc["background"], tuple(sorted((o["colour"], o["type"]) for o in sc["objects"])))


def render_pool(seed: int, n: int, pool: str = CLIP_POOL) -> TrainingPool:
    """``n`` scenes of the named pool, rendered in memory (nothing written)."""
    images, caps, scenes = [], [], []
    for pair in iter_training_pairs(seed, n, pool):
        images.append(pair.image)
        caps.append([normalize_caption(c) for c in pair.captions])
        scenes.append(pair.scene)
    return TrainingPool(images, caps, scenes)


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
    threads: int = 1,
) -> TrainLog:
    """Train the open_clip model saved at ``path`` (by :func:`adjcap.demo.tiny_clip.build_tiny_clip`)
    contrastively on ``pool`` (each step: ``batch`` images, one of each image's captions drawn at
    random) and write it back in place (safetensors; the sidecar config is unchanged)."""
    path = Path(path)
    t0 = time.perf_counter()
    enc = load_dual_encoder(model, str(path), device="cpu", precision="fp32")
    n = len(pool)
    batch = min(batch, n)
    with deterministic(seed, threads):
        pixels = enc.preprocess(pool.images)
        tok = enc.tokenize([c for caps in pool.captions for c in caps])
        per = len(pool.captions[0])
        net = enc.model.train()
        for p in net.parameters():
            p.requires_grad_(True)
        text = _TrainableText(enc, torch.unique(tok.ids))
        named = [(k, p) for k, p in net.named_parameters() if p.requires_grad] + [("text_delta_embed", text.delta)]
        opt = _adamw(named, lr, weight_decay)
        gen = torch.Generator().manual_seed(seed)
        trace = _LossTrace(steps)
        perm, pos = torch.randperm(n, generator=gen), 0
        labels = torch.arange(batch)
        max_scale = math.log(100.0)
        for step in range(steps):
            _set_lr(opt, _cosine_lr(step, steps, lr))
            if pos + batch > n:
                perm, pos = torch.randperm(n, generator=gen), 0
            idx = perm[pos : pos + batch]
            pos += batch
            tid = idx * per + torch.randint(0, per, (batch,), generator=gen)
            width = int(tok.lengths[tid].max())
            img = F.normalize(net.visual(pixels[idx]), dim=-1)
            txt = F.normalize(text(tok.ids[tid, :width]), dim=-1)
            logits = net.logit_scale.exp() * img @ txt.T
            loss = (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            with torch.no_grad():
                net.logit_scale.clamp_(0.0, max_scale)
            trace.add(loss)
        text.fold()
        net.eval()
        _save_clip(net, path, {"model": model, "seed": seed, "trained": {
            "pool": CLIP_POOL, "images": n, "steps": steps, "batch": batch, "lr": lr}})
    return trace.log(model, time.perf_counter() - t0, logit_scale=float(net.logit_scale.detach().exp()))


# --------------------------------------------------------------------------------------------
# BLIP ITM
# --------------------------------------------------------------------------------------------

COLOUR_WORDS: tuple[str, ...] = tuple(COLOURS)
# single-word object nouns, singular and plural -> the object kind
KIND_WORDS: dict[str, str] = {w: kind for kind, (plural, _, _) in OBJECTS.items() if " " not in kind
                              for w in (kind, plural)}


def swap_negative(caption: str, scene: dict[str, Any], rng: random.Random) -> str | None:
    """``caption`` with one colour word or one single-word object noun replaced by one that is not in
    the scene (a mismatched caption that differs in one word), or None when it has no such word."""
    colours, kinds = COLOUR_WORDS, KIND_WORDS
    present_c = {o["colour"] for o in scene["objects"]}
    present_k = {o["type"] for o in scene["objects"]}
    words = caption.split(" ")
    slots = []
    for i, w in enumerate(words):
        core = w.rstrip(".,").lower()
        if core in colours and core != "green":  # "green field" / "green lawn" describe the background
            slots.append((i, "c", core))
        elif core in kinds:
            slots.append((i, "k", core))
    if not slots:
        return None
    i, what, core = slots[rng.randrange(len(slots))]
    if what == "c":
        choices = [c for c in colours if c not in present_c and c != "green"]
        new = rng.choice(choices)
    else:
        plural = kinds[core] != core
        choices = sorted({k for k in kinds.values() if k not in present_k})
        kind = rng.choice(choices)
        new = next(w for w, k in kinds.items() if k == kind and (w != k) == plural) if plural else kind
    w = words[i]
    tail = w[len(w.rstrip(".,")) :]
    new = new.capitalize() if w[0].isupper() else new
    words[i] = new + tail
    return " ".join(words)


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
        opt = _adamw(named, lr, weight_decay)
        gen = torch.Generator().manual_seed(seed)
        trace = _LossTrace(steps)
        perm, pos = torch.randperm(n, generator=gen), 0
        k = max(1, int(negatives))
        labels = torch.cat([torch.ones(batch, dtype=torch.long), torch.zeros(batch * k, dtype=torch.long)])
        class_weight = torch.tensor([1.0, float(k)])  # as many positive as negative weight
        b = batch
        arange = torch.arange(b)
        cls_id = int(ver.tokenizer.cls_token_id)

        def negative(i: int, cap: str) -> str:
            u = rng.random()
            neg = swap_negative(cap, pool.scenes[i], rng) if u < swap_fraction else None
            if neg is None:
                if u < swap_fraction + hard_fraction:
                    j = rng.choice(hard[i])
                else:
                    j = rng.randrange(n - 1)
                    j = j + 1 if j >= i else j
                neg = pool.captions[j][rng.randrange(per)]
            return neg

        for step in range(steps):
            _set_lr(opt, _cosine_lr(step, steps, lr))
            if pos + batch > n:
                perm, pos = torch.randperm(n, generator=gen), 0
            idx = perm[pos : pos + batch].tolist()
            pos += batch
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
        opt = _adamw(named, lr, weight_decay)
        rng = random.Random(f"adjcap-tiny-ifcap:{seed}")
        gen = torch.Generator().manual_seed(seed)
        trace = _LossTrace(steps)
        n = len(texts)
        batch = min(batch, n)
        lengths = torch.tensor([len(c) for c in cap_ids])
        batches: list[torch.Tensor] = []
        prompt_cache: dict[tuple[str, ...], list[int]] = {}
        soft_len = dims.prefix_length
        std = math.sqrt(noise_variance)
        for step in range(steps):
            _set_lr(opt, _cosine_lr(step, steps, lr))
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


def train_tiny_world(
    paths: dict[str, Path],
    corpus_texts: Sequence[str],
    seed: int = 42,
    settings: TinyTrainSettings = TinyTrainSettings(),
    *,
    retrieval_model: str = "adjcap-tiny-clip",
    captioner_model: str = "adjcap-tiny-clip",
    mapping_heads: int = 2,
) -> dict[str, Any]:
    """Train every model of a freshly built (random) tiny world in place; returns the training logs."""
    s = settings
    t0 = time.perf_counter()
    pool = render_pool(seed, s.pool_images, CLIP_POOL)
    render_s = time.perf_counter() - t0
    logs: dict[str, Any] = {"render_seconds": round(render_s, 3), "settings": asdict(s)}
    logs["captioner_clip"] = train_clip(
        paths["captioner_clip"], pool, model=captioner_model, seed=seed + 1, steps=s.clip_steps,
        batch=s.clip_batch, lr=s.clip_lr, threads=s.threads).as_dict()
    if s.retrieval_clip_steps > 0:
        logs["retrieval_clip"] = train_clip(
            paths["retrieval_clip"], pool, model=retrieval_model, seed=seed, steps=s.retrieval_clip_steps,
            batch=s.clip_batch, lr=s.clip_lr, threads=s.threads).as_dict()
    else:
        if retrieval_model != captioner_model:
            raise ValueError(
                f"retrieval_clip_steps=0 copies the captioner CLIP ({captioner_model}) into the retrieval role, "
                f"which is configured as {retrieval_model}; train it (retrieval_clip_steps > 0) or use one model")
        _copy_clip(paths["captioner_clip"], paths["retrieval_clip"])
        logs["retrieval_clip"] = {"copy_of": "captioner_clip"}
    enc = load_dual_encoder(captioner_model, str(paths["captioner_clip"]), device="cpu", precision="fp32",
                            towers=("text",))
    with deterministic(seed, s.threads):
        scene_feats = scene_text_features(enc, pool)
    logs["blip"] = train_blip_itm(
        paths["blip"], pool, seed=seed, steps=s.blip_steps, batch=s.blip_batch, lr=s.blip_lr,
        text_features=scene_feats, threads=s.threads).as_dict()
    logs["ifcap"] = train_ifcap(
        paths["ifcap"].parent, paths["tokenizer"], paths["captioner_clip"], corpus_texts, seed=seed,
        steps=s.ifcap_steps, batch=s.ifcap_batch, lr=s.ifcap_lr, clip_model=captioner_model,
        mapping_heads=mapping_heads, threads=s.threads).as_dict()
    logs["seconds"] = round(time.perf_counter() - t0, 3)
    return logs

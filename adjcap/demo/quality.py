"""How good the tiny world's models are, measured on held-out rendered scenes (pool "clip-heldout",
never trained on, never a benchmark split), and what a caption gets wrong about its scene.

These are the numbers of the demo's build log (``{cache}/tiny/QUALITY.json``, docs/guide/demo.md) and of
the tests that guard the demo's effect stage by stage: the judges (retrieval CLIP, BLIP ITM) must be
good at this world, the text-only captioner must make the paper's errors (wrong colours, objects,
counts), and only then can adjudication beat the LM-only pick.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from adjcap.demo.train_base import HELDOUT_POOL, TrainingPool, deterministic, render_pool
from adjcap.demo.negatives import count_negative, insert_negative, swap_negative
from adjcap.demo.world import COLOURS, OBJECTS
from adjcap.models.sources import OPEN_CLIP_CONFIG

_NUMBER_WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "single": 1}
# "a green field", "a white wall", "a plain background": colour words of the setting, not of an object
_SETTING_NOUNS = frozenset({"field", "lawn", "wall", "background", "sky", "sea", "table"})
_GENERIC = frozenset({"objects", "things", "shapes"})
_KIND_WORDS: dict[str, str] = {}
for _kind, (_plural, _, _) in OBJECTS.items():
    _KIND_WORDS[_kind.split()[-1]] = _kind
    _KIND_WORDS[_plural.split()[-1]] = _kind


def caption_errors(caption: str, scene: dict[str, Any]) -> list[str]:
    """What ``caption`` says that its scene contradicts: a colour no object has ("colour:blue"), an
    object kind that is absent ("object:kite"), or a count that differs from the scene's ("count:two
    balls" when there is one ball; "two things" when there are three objects). Empty = no error found."""
    objs = scene["objects"]
    colours = {o["colour"] for o in objs}
    kinds = {o["type"] for o in objs}
    words = re.findall(r"[a-z]+", caption.lower())
    errors: list[str] = []
    for i, w in enumerate(words):
        nxt = words[i + 1] if i + 1 < len(words) else ""
        if w in COLOURS and w not in colours and nxt not in _SETTING_NOUNS:
            errors.append(f"colour:{w}")
        elif w in _KIND_WORDS and _KIND_WORDS[w] not in kinds:
            if w == "sign" and words[i - 1 : i] != ["stop"]:
                continue
            errors.append(f"object:{_KIND_WORDS[w]}")
        elif w in _NUMBER_WORDS and w != "single":
            # the noun the number counts: the next kind / generic noun within 3 words, colour on the way
            colour = None
            for v in words[i + 1 : i + 4]:
                if v in COLOURS:
                    colour = v
                elif v in _GENERIC:
                    if _NUMBER_WORDS[w] != len(objs):
                        errors.append(f"count:{w} {v}")
                    break
                elif v in _KIND_WORDS:
                    kind = _KIND_WORDS[v]
                    have = sum(1 for o in objs if o["type"] == kind and colour in (None, o["colour"]))
                    if have and _NUMBER_WORDS[w] != have:
                        errors.append(f"count:{w} {v}")
                    break
    return errors


def heldout_pool(seed: int, n: int) -> TrainingPool:
    return render_pool(seed, n, HELDOUT_POOL)


def retrieval_recall(enc, pool: TrainingPool, ks: Sequence[int] = (1, 5)) -> dict[str, float]:
    """Image -> text and text -> image recall@k over the pool (one caption per scene: its first;
    scenes whose content is identical count as correct for each other)."""
    sim = enc.encode_images(pool.images).float() @ enc.encode_texts([c[0] for c in pool.captions]).float().T
    sigs = [pool.signature(i) for i in range(len(pool))]
    same = torch.tensor([[a == b for b in sigs] for a in sigs])
    out: dict[str, float] = {}
    for k in ks:
        i2t = same.gather(1, sim.topk(k, dim=1).indices).any(1).float().mean().item()
        t2i = same.gather(1, sim.T.topk(k, dim=1).indices).any(1).float().mean().item()
        out[f"i2t_r@{k}"] = round(i2t, 4)
        out[f"t2i_r@{k}"] = round(t2i, 4)
    out["images"] = len(pool)
    return out


def itm_accuracy(ver, pool: TrainingPool, seed: int = 0) -> dict[str, float]:
    """BLIP ITM on held-out pairs: each image with a true caption, a caption with one colour or object
    word swapped for an absent one, a caption with a wrong count (when the scene has a countable
    group), the true caption with an absent object added, and another scene's caption. ``accuracy``: the match probability on the right side of 0.5,
    over all pairs; ``pairwise_*``: how often the true caption scores above each kind of negative."""
    rng = random.Random(f"adjcap-quality:{seed}")
    n = len(pool)
    pos, swap, count, insert, other = [], [], [], [], []
    for i in range(n):
        cap = pool.captions[i][0]
        pos.append(cap)
        swap.append(swap_negative(cap, pool.scenes[i], rng))
        count.append(count_negative(pool.captions[i], pool.scenes[i], rng))
        insert.append(insert_negative(cap, pool.scenes[i], rng))
        j = (i + 1 + rng.randrange(n - 1)) % n
        other.append(pool.captions[j][0])
    negs = list(zip(swap, count, insert, other))
    pairs = [[p, *(x for x in ng if x is not None)] for p, ng in zip(pos, negs)]
    probs = ver.score(ver.encode_images(pool.images), pairs)
    right, total = 0, 0
    wins = {"swap": [0, 0], "count": [0, 0], "insert": [0, 0], "other": [0, 0]}
    for pr, ng in zip(probs, negs):
        pr = [float(x) for x in pr]
        right += pr[0] > 0.5
        total += 1
        k = 1
        for name, neg in zip(("swap", "count", "insert", "other"), ng):
            if neg is None:
                continue
            right += pr[k] < 0.5
            total += 1
            wins[name][0] += pr[0] > pr[k]
            wins[name][1] += 1
            k += 1
    out = {"accuracy": round(right / total, 4), "pairs": total}
    for name, (w, m) in wins.items():
        out[f"pairwise_{name}"] = round(w / m, 4) if m else None
    return out


def judge_quality(tiny_root: str | Path, seed: int = 42, n: int = 200, models: dict[str, str] | None = None
                  ) -> dict[str, Any]:
    """Held-out quality of the judges (retrieval CLIP, BLIP ITM) and, for comparison, of the
    captioner's own CLIP, on ``n`` scenes of the held-out pool. ``models``: the open_clip model name
    of each role ("retrieval", "captioner"); default the name saved beside its weights."""
    from adjcap.models.blip import load_verifier
    from adjcap.models.clip import load_dual_encoder

    root = Path(tiny_root)
    models = models or {role: json.loads((root / f"{role}-clip" / OPEN_CLIP_CONFIG).read_text())["model_name"]
                        for role in ("retrieval", "captioner")}
    pool = heldout_pool(seed, n)
    out: dict[str, Any] = {"pool": HELDOUT_POOL, "images": n}
    with deterministic(seed, 1):
        for role in ("retrieval", "captioner"):
            enc = load_dual_encoder(models[role], str(root / f"{role}-clip"), device="cpu")
            out[f"{role}_clip"] = retrieval_recall(enc, pool)
        ver = load_verifier(str(root / "blip-itm"), device="cpu")
        out["blip_itm"] = itm_accuracy(ver, pool, seed)
    return out

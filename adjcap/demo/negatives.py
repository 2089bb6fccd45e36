"""Mismatched captions that differ from a true one in a single word (a colour, an object, a count) or
by one added object the scene does not have:
the hard negatives of the tiny judges' trainings and of their held-out checks."""

from __future__ import annotations

import random
from typing import Any

from adjcap.demo.world import COLOURS, OBJECTS

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


COUNT_WORDS: tuple[str, ...] = ("two", "three", "four", "five")


def count_negative(captions: list[str], scene: dict[str, Any], rng: random.Random) -> str | None:
    """One of ``captions`` with one plural count word ("two", "three", ...) replaced by another (a
    mismatched caption that differs only in a count), or None when no caption states a count."""
    slots = [(c, i) for c, cap in enumerate(captions) for i, w in enumerate(cap.split(" "))
             if w.rstrip(".,").lower() in COUNT_WORDS]
    if not slots:
        return None
    c, i = slots[rng.randrange(len(slots))]
    words = captions[c].split(" ")
    w = words[i]
    core = w.rstrip(".,").lower()
    new = rng.choice([x for x in COUNT_WORDS if x != core])
    words[i] = (new.capitalize() if w[0].isupper() else new) + w[len(w.rstrip(".,")):]
    return " ".join(words)


def insert_negative(caption: str, scene: dict[str, Any], rng: random.Random) -> str:
    """``caption`` with an object the scene does not have added ("... on the grass next to a white
    clock."): the hallucinated extra object a captioner's beam is full of."""
    present = {o["type"] for o in scene["objects"]}
    kind = rng.choice(sorted(k for k in OBJECTS if k not in present))
    colour = rng.choice(OBJECTS[kind][1] or tuple(COLOURS))
    core = f"{colour} {kind}"
    phrase = f"{'an' if core[0] in 'aeiou' else 'a'} {core}"
    body = caption.rstrip()
    end = "." if body.endswith(".") else ""
    return f"{body.rstrip('.')} next to {phrase}{end}"


def hard_negative(captions: list[str], k: int, scene: dict[str, Any], rng: random.Random,
                  count_share: float = 0.25, insert_share: float = 0.25) -> str | None:
    """A near-miss negative of ``captions[k]``: a wrong count (with probability ``count_share``, when a
    caption of the scene states a count), an added absent object (``insert_share``), else a swapped
    colour or object (None when the caption has no such word)."""
    u = rng.random()
    if u < count_share:
        neg = count_negative(captions, scene, rng)
        if neg is not None:
            return neg
    elif u < count_share + insert_share:
        return insert_negative(captions[k], scene, rng)
    return swap_negative(captions[k], scene, rng)

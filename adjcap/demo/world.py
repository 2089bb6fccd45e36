"""The demo world: a small deterministic synthetic captioning benchmark.

Scenes of coloured shapes and simple objects (balls, kites, clocks, umbrellas, cars, trees, houses,
stop signs, ...) on simple backgrounds (grass under a sky, a beach, a table, a street, snow, a plain
wall) are drawn with PIL; each image gets 5 reference captions written from its scene in COCO-like
English ("A red circle next to a green triangle on the grass."). A text-only training corpus of
``n_corpus_images`` x 5 captions comes from the same scene generator. Files, in IFCap layout::

    root/images/demo-{val,test}-NNNN.png
    root/annotations/{train,val,test}_captions.json     {file name: [5 captions]}
    root/annotations/alt_captions.txt                    a second corpus in another style, one caption a line
    root/manifest.json                                   written last; marks the world complete

The scene of every image (background, objects with colour/size/position) is in the manifest, so tests
can check captions and hallucinations against the truth.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
from PIL import Image, ImageDraw

from adjcap.storage.io import atomic_write_bytes, atomic_write_json

DEMO_VERSION = 1

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 35),
    "green": (40, 170, 60),
    "blue": (35, 75, 215),
    "yellow": (245, 215, 40),
    "orange": (245, 135, 25),
    "purple": (135, 55, 175),
    "pink": (245, 130, 185),
    "white": (250, 250, 250),
    "black": (20, 20, 20),
    "brown": (130, 80, 40),
}

# object type -> (plural, colours it may take (None: any), placement: ground | sky | any)
OBJECTS: dict[str, tuple[str, tuple[str, ...] | None, str]] = {
    "circle": ("circles", None, "any"),
    "square": ("squares", None, "any"),
    "triangle": ("triangles", None, "any"),
    "star": ("stars", ("yellow", "red", "orange", "white", "pink"), "any"),
    "ball": ("balls", ("red", "blue", "yellow", "orange", "white", "green"), "ground"),
    "box": ("boxes", ("brown", "red", "blue", "green", "white"), "ground"),
    "kite": ("kites", ("red", "blue", "yellow", "orange", "purple", "green", "pink"), "sky"),
    "clock": ("clocks", ("white",), "any"),
    "umbrella": ("umbrellas", ("red", "blue", "black", "purple", "yellow", "pink"), "ground"),
    "car": ("cars", ("red", "blue", "black", "white", "yellow", "green"), "ground"),
    "tree": ("trees", ("green",), "ground"),
    "house": ("houses", ("white", "yellow", "red", "blue", "brown"), "ground"),
    "stop sign": ("stop signs", ("red",), "ground"),
}
_INDOOR = ("table", "wall")
_NO_SKY_OBJECTS = ("tree", "house", "car", "kite", "stop sign", "umbrella")

# background -> (phrases "X" for "... X.", scene nouns for "A X with ...", has sky)
BACKGROUNDS: dict[str, tuple[tuple[str, ...], tuple[str, ...], bool]] = {
    "grass": (("on the grass", "in a grassy field", "on a green lawn", "in a field"), ("grassy field", "green field", "park"), True),
    "beach": (("on the beach", "on the sand", "by the sea"), ("sandy beach", "beach"), True),
    "street": (("on the street", "on a road", "in the street"), ("city street", "road"), True),
    "snow": (("in the snow", "on a snowy field", "on the snow"), ("snowy field", "snow covered field"), True),
    "table": (("on a wooden table", "on a table", "on top of a table"), ("wooden table", "table"), False),
    "wall": (("on a white background", "against a plain wall", "on a plain background"), ("white wall", "plain background"), False),
}

_NUMBERS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five"}
_SIZES = ("small", "medium", "large")
_IMAGE_SIZES = ((160, 120), (144, 144), (120, 160))


@dataclass
class _Obj:
    kind: str
    colour: str
    size: str
    cx: float  # centre, fraction of width
    cy: float  # centre, fraction of height
    r: float  # radius, fraction of min side

    def as_dict(self) -> dict[str, Any]:
        return {"type": self.kind, "colour": self.colour, "size": self.size,
                "x": round(self.cx, 4), "y": round(self.cy, 4), "r": round(self.r, 4)}


# --------------------------------------------------------------------------------------------
# Scenes
# --------------------------------------------------------------------------------------------


def _sample_scene(rng: random.Random) -> dict[str, Any]:
    bg = rng.choice(list(BACKGROUNDS))
    n = rng.choices((1, 2, 3), weights=(0.3, 0.45, 0.25))[0]
    kinds = list(OBJECTS)
    if bg in _INDOOR:
        kinds = [k for k in kinds if k not in _NO_SKY_OBJECTS]
    objs: list[_Obj] = []
    slots = list(range(n))
    rng.shuffle(slots)
    first = rng.choice(kinds)
    for i in range(n):
        # sometimes repeat the first object (to produce counts: "two red balls")
        if i > 0 and rng.random() < 0.25:
            kind, colour = objs[0].kind, objs[0].colour
        else:
            kind = first if i == 0 else rng.choice(kinds)
            allowed = OBJECTS[kind][1] or tuple(COLOURS)
            allowed = tuple(c for c in allowed if not _clashes(c, bg)) or allowed
            colour = rng.choice(allowed)
        size = rng.choices(_SIZES, weights=(0.3, 0.45, 0.25))[0]
        r = {"small": 0.09, "medium": 0.14, "large": 0.2}[size] * rng.uniform(0.9, 1.1)
        # horizontal slot so that left/right relations are unambiguous
        cx = (slots[i] + 0.5) / n + rng.uniform(-0.08, 0.08) / n
        place = OBJECTS[kind][2]
        has_sky = BACKGROUNDS[bg][2]
        if has_sky and place == "sky":
            cy = rng.uniform(0.15, 0.3)
        elif has_sky:
            cy = rng.uniform(0.62, 0.78)
        else:
            cy = rng.uniform(0.35, 0.65)
        objs.append(_Obj(kind, colour, size, cx, cy, r))
    objs.sort(key=lambda o: o.cx)
    return {"background": bg, "objects": objs}


def _clashes(colour: str, bg: str) -> bool:
    return (bg, colour) in {("grass", "green"), ("snow", "white"), ("wall", "white"), ("beach", "yellow"), ("table", "brown")}


# --------------------------------------------------------------------------------------------
# Drawing
# --------------------------------------------------------------------------------------------


def _draw_background(d: ImageDraw.ImageDraw, bg: str, w: int, h: int, rng: random.Random) -> None:
    sky = (135 + rng.randint(-10, 10), 195 + rng.randint(-10, 10), 240)
    horizon = int(h * rng.uniform(0.45, 0.55))
    if bg == "grass":
        d.rectangle([0, 0, w, horizon], fill=sky)
        d.rectangle([0, horizon, w, h], fill=(70 + rng.randint(-10, 10), 150, 60))
    elif bg == "beach":
        sea = horizon + int(h * 0.12)
        d.rectangle([0, 0, w, horizon], fill=sky)
        d.rectangle([0, horizon, w, sea], fill=(30, 110, 180))
        d.rectangle([0, sea, w, h], fill=(230, 205, 150))
    elif bg == "street":
        d.rectangle([0, 0, w, horizon], fill=sky)
        d.rectangle([0, horizon, w, h], fill=(105, 105, 110))
        y = (horizon + h) // 2
        for x in range(0, w, 24):
            d.rectangle([x, y - 1, x + 12, y + 1], fill=(240, 220, 60))
    elif bg == "snow":
        d.rectangle([0, 0, w, horizon], fill=(175, 200, 225))
        d.rectangle([0, horizon, w, h], fill=(240, 244, 250))
    elif bg == "table":
        d.rectangle([0, 0, w, h], fill=(165, 115, 70))
        for y in range(6, h, 14):
            d.line([0, y, w, y + rng.randint(-3, 3)], fill=(145, 98, 58), width=1)
    else:  # wall
        g = 225 + rng.randint(-8, 8)
        d.rectangle([0, 0, w, h], fill=(g, g, g - 5))


def _poly(cx: float, cy: float, r: float, n: int, rot: float = -math.pi / 2) -> list[tuple[float, float]]:
    return [(cx + r * math.cos(rot + 2 * math.pi * k / n), cy + r * math.sin(rot + 2 * math.pi * k / n)) for k in range(n)]


def _draw_object(d: ImageDraw.ImageDraw, o: _Obj, w: int, h: int) -> None:
    s = min(w, h)
    cx, cy, r = o.cx * w, o.cy * h, o.r * s
    c = COLOURS[o.colour]
    dark = tuple(max(0, v - 70) for v in c)
    box = [cx - r, cy - r, cx + r, cy + r]
    k = o.kind
    if k == "circle":
        d.ellipse(box, fill=c)
    elif k == "square":
        d.rectangle(box, fill=c)
    elif k == "triangle":
        d.polygon(_poly(cx, cy + r * 0.2, r * 1.15, 3), fill=c)
    elif k == "star":
        pts = []
        for i in range(10):
            rr = r if i % 2 == 0 else r * 0.45
            a = -math.pi / 2 + math.pi * i / 5
            pts.append((cx + rr * math.cos(a), cy + rr * math.sin(a)))
        d.polygon(pts, fill=c)
    elif k == "ball":
        d.ellipse(box, fill=c, outline=dark, width=max(1, int(r / 8)))
        d.arc([cx - r * 0.9, cy - r * 1.6, cx + r * 0.9, cy + r * 0.2], 20, 160, fill=dark, width=max(1, int(r / 10)))
    elif k == "box":
        d.rectangle(box, fill=c, outline=dark, width=max(1, int(r / 8)))
        d.line([cx - r, cy - r, cx + r, cy + r], fill=dark, width=1)
        d.line([cx - r, cy + r, cx + r, cy - r], fill=dark, width=1)
    elif k == "kite":
        pts = [(cx, cy - r * 1.2), (cx + r * 0.75, cy), (cx, cy + r * 1.2), (cx - r * 0.75, cy)]
        d.polygon(pts, fill=c)
        d.line([cx, cy + r * 1.2, cx - r * 0.5, cy + r * 2.2, cx + r * 0.2, cy + r * 2.8], fill=(60, 60, 60), width=1)
    elif k == "clock":
        d.ellipse(box, fill=(250, 250, 250), outline=(20, 20, 20), width=max(1, int(r / 7)))
        d.line([cx, cy, cx, cy - r * 0.7], fill=(20, 20, 20), width=max(1, int(r / 9)))
        d.line([cx, cy, cx + r * 0.5, cy + r * 0.1], fill=(20, 20, 20), width=max(1, int(r / 9)))
    elif k == "umbrella":
        d.pieslice([cx - r, cy - r, cx + r, cy + r], 180, 360, fill=c)
        d.line([cx, cy, cx, cy + r], fill=(40, 40, 40), width=max(1, int(r / 8)))
        d.arc([cx - r * 0.3, cy + r * 0.8, cx, cy + r * 1.1], 0, 180, fill=(40, 40, 40), width=1)
    elif k == "car":
        d.rectangle([cx - r * 1.2, cy - r * 0.3, cx + r * 1.2, cy + r * 0.35], fill=c)
        d.rectangle([cx - r * 0.6, cy - r * 0.75, cx + r * 0.6, cy - r * 0.3], fill=c)
        d.rectangle([cx - r * 0.5, cy - r * 0.68, cx + r * 0.5, cy - r * 0.34], fill=(190, 225, 245))
        for wx in (cx - r * 0.7, cx + r * 0.7):
            d.ellipse([wx - r * 0.28, cy + r * 0.12, wx + r * 0.28, cy + r * 0.68], fill=(20, 20, 20))
    elif k == "tree":
        d.rectangle([cx - r * 0.18, cy, cx + r * 0.18, cy + r * 1.1], fill=(110, 70, 35))
        d.ellipse([cx - r * 0.8, cy - r * 1.1, cx + r * 0.8, cy + r * 0.3], fill=(30, 130, 45))
    elif k == "house":
        d.rectangle([cx - r * 0.8, cy - r * 0.2, cx + r * 0.8, cy + r], fill=c)
        d.polygon([(cx - r, cy - r * 0.2), (cx + r, cy - r * 0.2), (cx, cy - r * 1.1)], fill=(170, 40, 40))
        d.rectangle([cx - r * 0.2, cy + r * 0.4, cx + r * 0.2, cy + r], fill=(90, 60, 30))
    elif k == "stop sign":
        d.line([cx, cy, cx, cy + r * 1.6], fill=(120, 120, 120), width=max(1, int(r / 6)))
        d.polygon(_poly(cx, cy, r, 8, rot=math.pi / 8), fill=COLOURS["red"])
        d.rectangle([cx - r * 0.55, cy - r * 0.12, cx + r * 0.55, cy + r * 0.12], fill=(250, 250, 250))


def _render_image(scene: dict[str, Any], rng: random.Random) -> Image.Image:
    w, h = rng.choice(_IMAGE_SIZES)
    im = Image.new("RGB", (w, h))
    d = ImageDraw.Draw(im)
    _draw_background(d, scene["background"], w, h, rng)
    # far (higher) objects first so nearer ones overlap them
    for o in sorted(scene["objects"], key=lambda o: o.cy):
        _draw_object(d, o, w, h)
    return im


def _render(scene: dict[str, Any], rng: random.Random) -> bytes:
    im = _render_image(scene, rng)
    buf = io.BytesIO()
    im.save(buf, format="PNG", optimize=False, compress_level=6)
    return buf.getvalue()


# --------------------------------------------------------------------------------------------
# Captions
# --------------------------------------------------------------------------------------------


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _groups(objs: list[_Obj]) -> list[tuple[int, str, str, str]]:
    """(count, colour, kind, size of the first) groups of identical (colour, kind), left to right."""
    seen: dict[tuple[str, str], list[_Obj]] = {}
    for o in objs:
        seen.setdefault((o.colour, o.kind), []).append(o)
    return [(len(v), c, k, v[0].size) for (c, k), v in seen.items()]


def _np(count: int, colour: str | None, kind: str, size: str | None = None) -> str:
    """Noun phrase: 'a red circle', 'a large blue ball', 'two green triangles'."""
    noun = kind if count == 1 else OBJECTS[kind][0]
    mods = [m for m in (size if size in ("small", "large") else None, colour) if m]
    core = " ".join(mods + [noun])
    if count == 1:
        return f"{_article(core)} {core}"
    return f"{_NUMBERS[count]} {core}"


def _join(items: list[str]) -> str:
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + " and " + items[-1]


def _cap(s: str) -> str:
    return s[0].upper() + s[1:]


def _captions(scene: dict[str, Any], rng: random.Random, n: int = 5) -> list[str]:
    bg = scene["background"]
    objs: list[_Obj] = scene["objects"]
    places, scene_nouns, _ = BACKGROUNDS[bg]
    groups = _groups(objs)
    total = len(objs)
    plural = total > 1
    where = rng.choice(places)
    scene_noun = rng.choice(scene_nouns)

    def phrase(g: tuple[int, str, str, str], with_size: bool = False, with_colour: bool = True) -> str:
        cnt, col, kind, size = g
        return _np(cnt, col if with_colour else None, kind, size if with_size else None)

    listed = _join([phrase(g) for g in groups])
    listed_sized = _join([phrase(g, with_size=True) for g in groups])
    listed_plain = _join([phrase(g, with_colour=False) for g in groups])
    cands: list[str] = [
        f"{_cap(listed)} {where}.",
        f"There {'are' if plural or groups[0][0] > 1 else 'is'} {listed} {rng.choice(places)}.",
        f"{_cap(_article(scene_noun))} {scene_noun} with {listed_plain}.",
        f"{rng.choice(['A picture', 'A drawing', 'An image', 'A simple drawing', 'A photo'])} of {listed_sized}.",
    ]
    kites = [o for o in objs if o.kind == "kite"]
    if kites and BACKGROUNDS[bg][2]:
        k = kites[0]
        cands.append(f"{_cap(_np(1, k.colour, 'kite'))} flying in the sky above the {scene_noun}.")
    if total == 1:
        o = objs[0]
        one = _np(1, o.colour, o.kind)
        cands += [
            f"{_cap(one)} in the middle of the picture.",
            f"A single {o.kind} {rng.choice(places)}.",
            f"{_cap(_np(1, o.colour, o.kind, o.size))} sitting {rng.choice(places)}.",
        ]
    else:
        a, b = objs[0], objs[-1]
        pa, pb = _np(1, a.colour, a.kind), _np(1, b.colour, b.kind)
        if a.kind == b.kind and a.colour == b.colour:
            same = sum(1 for o in objs if (o.kind, o.colour) == (a.kind, a.colour))
            cands += [f"{_cap(_np(same, a.colour, a.kind))} next to each other {where}."]
        else:
            cands += [
                f"{_cap(pa)} to the left of {pb}.",
                f"{_cap(pb)} on the right side of {pa}.",
                f"{_cap(pa)} next to {pb} {rng.choice(places)}.",
            ]
        noun = rng.choice(["objects", "things", "shapes"])
        cands.append(f"{_cap(_NUMBERS[total])} {rng.choice(['colorful ', 'different ', ''])}{noun} {where}.")
    rng.shuffle(cands)
    out = cands[:n]
    while len(out) < n:  # not reached with the templates above, kept for safety
        out.append(cands[len(out) % len(cands)])
    # a little COCO-style noise: some captions lower-case without a final period
    for i in range(len(out)):
        if rng.random() < 0.15:
            out[i] = out[i][0].lower() + out[i][1:-1]
    return out


# The second caption corpus (``alt_captions.txt``, the corpus registry's ``demo-alt``): the same kind of
# scenes described in another style, as web alt-text reads (the stand-in for CC3M / LAION-COCO in
# `adjcap reproduce corpus-swap --benchmark demo`): other templates and other words for the objects, colours
# and places, no counts, no left/right.
_ALT_NOUNS = {"circle": "disc", "square": "tile", "triangle": "pyramid", "star": "starburst", "ball": "sphere",
              "box": "crate", "kite": "glider", "clock": "timepiece", "umbrella": "parasol", "car": "automobile",
              "tree": "oak", "house": "cottage", "stop sign": "octagon placard"}
_ALT_COLOURS = {"red": "crimson", "green": "emerald", "blue": "navy", "yellow": "golden", "orange": "amber",
                "purple": "violet", "pink": "rose", "white": "ivory", "black": "ebony", "brown": "chestnut"}
_ALT_PLACES = {"grass": ("meadow", "lawn outdoors"), "beach": ("seaside", "coast"), "street": ("city road", "avenue"),
               "snow": ("winter field", "snowy slope"), "table": ("tabletop", "wooden desk"),
               "wall": ("studio backdrop", "blank backdrop")}


def _alt_captions(scene: dict[str, Any], rng: random.Random, n: int = 5) -> list[str]:
    objs: list[_Obj] = scene["objects"]
    place = rng.choice(_ALT_PLACES[scene["background"]])
    things = [f"{_ALT_COLOURS[o.colour]} {_ALT_NOUNS[o.kind]}" for o in objs]
    listed = _join(list(dict.fromkeys(things)))
    cands = [
        f"stock photo of {listed} in a {place}",
        f"{listed} against a {place}, vector illustration",
        f"close up of {listed} at the {place}",
        f"cartoon {_ALT_NOUNS[objs[0].kind]} design on a {place} background",
        f"royalty free image: {listed} and a {place}",
        f"{_ALT_COLOURS[objs[-1].colour]} {_ALT_NOUNS[objs[-1].kind]} icon, flat style",
    ]
    rng.shuffle(cands)
    return cands[:n]


ALT_SCENES_PER_CORPUS_IMAGE = 2  # x n_corpus_images / 3: 400 scenes, 2,000 captions beside the 3,000 of the first


def alt_corpus_lines(seed: int, n_scenes: int) -> list[str]:
    """The demo world's second corpus: ``n_scenes`` scenes of their own random stream, 5 captions each."""
    rng = random.Random(f"adjcap-demo:{seed}:alt-corpus")
    out: list[str] = []
    for _ in range(n_scenes):
        out += _alt_captions(_sample_scene(rng), rng)
    return out


# --------------------------------------------------------------------------------------------
# The world
# --------------------------------------------------------------------------------------------


# Nouns of the demo grammar (NLTK-style tags: NN singular, NNS plural) with their lemmas. The demo
# world is a closed vocabulary, so this lexicon tags its captions exactly; it lets the frequency
# entity filter run where NLTK's tagger data cannot be installed (see captioner.entities.tagger).
_EXTRA_NOUNS = ("grass", "field", "lawn", "beach", "sand", "sea", "street", "road", "city", "snow", "table",
                "wall", "background", "park", "picture", "drawing", "image", "photo", "sky", "middle", "side",
                "left", "right", "top", "object", "thing", "shape", "sign")


def demo_lexicon() -> dict[str, list[str]]:
    """{lower-case word: [tag, lemma]} for every noun the demo captions use."""
    lex: dict[str, list[str]] = {}
    for kind, (plural, _, _) in OBJECTS.items():
        for s_word, p_word in zip(kind.split(), plural.split()):
            lex[s_word] = ["NN", s_word]
            lex[p_word] = ["NNS", s_word]
    for noun in _EXTRA_NOUNS:
        lex.setdefault(noun, ["NN", noun])
        lex.setdefault(noun + ("es" if noun.endswith(("s", "x", "ch", "sh")) else "s"), ["NNS", noun])
    return dict(sorted(lex.items()))


def _paths(root: Path) -> dict[str, Path]:
    ann = root / "annotations"
    return {
        "root": root,
        "lexicon": root / "lexicon.json",
        "images": root / "images",
        "annotations": ann,
        "train": ann / "train_captions.json",
        "alt": ann / "alt_captions.txt",  # the second corpus (other style); outside the manifest, like the lexicon
        "val": ann / "val_captions.json",
        "test": ann / "test_captions.json",
        "manifest": root / "manifest.json",
    }


def _params(seed: int, n_test: int, n_val: int, n_corpus_images: int) -> dict[str, int]:
    return {"version": DEMO_VERSION, "seed": seed, "n_test": n_test, "n_val": n_val, "n_corpus_images": n_corpus_images}


def _complete(paths: dict[str, Path], params: dict[str, int]) -> bool:
    try:
        man = json.loads(paths["manifest"].read_text())
    except (OSError, ValueError):
        return False
    if man.get("params") != params:
        return False
    root = paths["root"]
    return all((root / rel).is_file() and (root / rel).stat().st_size == size for rel, size in man.get("files", {}).items())


def build_demo_world(
    root: str | Path, seed: int = 42, n_test: int = 300, n_val: int = 100, n_corpus_images: int = 600
) -> dict[str, Path]:
    """Write (or reuse, when complete with the same parameters) the demo world under ``root``.

    The defaults are the demo's: 300 test images (enough that the headline's bootstrap intervals
    separate a real effect from noise), 100 val images (the inductive fit), 600 x 5 corpus captions.

    Returns paths: root, lexicon, images, annotations, train, val, test, manifest. Deterministic: the same
    arguments give byte-identical files. The manifest is written last; files are written atomically.
    """
    root = Path(root).expanduser()
    paths = _paths(root)
    params = _params(seed, n_test, n_val, n_corpus_images)
    if _complete(paths, params):
        if not paths["lexicon"].is_file():
            atomic_write_json(paths["lexicon"], demo_lexicon())
        _write_alt(paths["alt"], seed, ALT_SCENES_PER_CORPUS_IMAGE * n_corpus_images // 3)
        return paths
    atomic_write_json(paths["lexicon"], demo_lexicon())
    paths["images"].mkdir(parents=True, exist_ok=True)
    paths["annotations"].mkdir(parents=True, exist_ok=True)
    files: dict[str, int] = {}
    scenes: dict[str, Any] = {}
    for split, count in (("train", n_corpus_images), ("val", n_val), ("test", n_test)):
        rng = random.Random(f"adjcap-demo:{seed}:{split}")
        caps: dict[str, list[str]] = {}
        for i in range(count):
            name = f"demo-{split}-{i:04d}.png"
            scene = _sample_scene(rng)
            caps[name] = _captions(scene, rng)
            if split != "train":
                data = _render(scene, rng)
                rel = f"images/{name}"
                atomic_write_bytes(root / rel, data)
                files[rel] = len(data)
                scenes[name] = {"split": split, "background": scene["background"],
                                "objects": [o.as_dict() for o in scene["objects"]]}
        text = json.dumps(caps, indent=4, ensure_ascii=False) + "\n"
        atomic_write_bytes(paths[split], text.encode("utf-8"))
        files[f"annotations/{split}_captions.json"] = len(text.encode("utf-8"))
    digest = hashlib.sha256()
    for rel in sorted(files):
        digest.update(rel.encode() + b"\0" + (root / rel).read_bytes())
    _write_alt(paths["alt"], seed, ALT_SCENES_PER_CORPUS_IMAGE * n_corpus_images // 3)
    atomic_write_json(
        paths["manifest"],
        {"params": params, "fingerprint": digest.hexdigest()[:16], "files": files, "scenes": scenes},
    )
    return paths


def _write_alt(path: Path, seed: int, n_scenes: int) -> None:
    """Written when absent or not what this code makes (a few ms: checked on every build)."""
    body = ("\n".join(alt_corpus_lines(seed, n_scenes)) + "\n").encode("utf-8")
    if not path.is_file() or path.read_bytes() != body:
        atomic_write_bytes(path, body)


@dataclass
class RenderedPair:
    """One rendered scene of a training pool: the image (never written to disk), its 5 captions and
    the scene (background, objects) as in the manifest."""

    image: Image.Image
    captions: list[str]
    scene: dict[str, Any]


def iter_training_pairs(seed: int = 42, n: int = 1000, pool: str = "clip-train") -> Iterator[RenderedPair]:
    """Scenes of a separate image pool (``pool`` names its random stream, e.g. "clip-train" or
    "clip-heldout"), drawn and captioned exactly as the benchmark images are, for training and checking
    the tiny models. Deterministic in (seed, n, pool); independent of the benchmark splits; writes nothing."""
    if pool in ("train", "val", "test"):
        raise ValueError(f"pool {pool!r} is a benchmark split; name a separate pool such as 'clip-train'")
    rng = random.Random(f"adjcap-demo:{seed}:{pool}")
    for _ in range(int(n)):
        scene = _sample_scene(rng)
        caps = _captions(scene, rng)
        image = _render_image(scene, rng)
        yield RenderedPair(image, caps, {"background": scene["background"],
                                         "objects": [o.as_dict() for o in scene["objects"]]})


def demo_corpus_texts(root: str | Path) -> list[str]:
    """The demo training corpus, normalised as the retrieval corpus is (builds the world if absent)."""
    from adjcap.data.corpus import load_corpus

    paths = _paths(Path(root).expanduser())
    if not paths["train"].is_file():
        build_demo_world(root)
    return load_corpus(paths["train"], fmt="ifcap").texts


def random_images(n: int, size: int = 64, seed: int = 0) -> list[Image.Image]:
    """Deterministic random RGB images (tests and benchmarks)."""
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)) for _ in range(n)]

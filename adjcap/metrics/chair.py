"""CHAIR (Rohrbach et al. 2018, "Object Hallucination in Image Captioning"): the paper's reference
proxy and the original instance-annotation CHAIR, with one matcher.

Vocabulary: COCO's 80 object classes with the standard CHAIR synonym lists
(``resources/coco_synonyms.txt``; provenance in ``resources/NOTICE.md``). A caption is lower-cased
and split into word tokens; plural tokens of vocabulary words are singularised by a small
self-contained rule set (no NLTK data needed); multi-word names ("hot dog", "teddy bear",
"motor bike", "stove top oven") are matched before single words, longest first; and the special
cases of the CHAIR method apply:

* "baby"/"adult" + animal ("baby elephant", "adult bird") is the animal, not a person;
* "passenger jet"/"passenger train" is the vehicle, not a person;
* "toilet seat" is the toilet, and "seat" in a caption that mentions a toilet is not a chair;
* "bow tie" is a tie; "train track" and "home plate" are not objects (no train, no plate).

A hyphenated word is one token ("dog-like", "yellow-orange"), as the original CHAIR's tokenizer
(NLTK's ``word_tokenize``) keeps it, so neither names a dog or an orange.

Ground truth, the one rule in which the two CHAIRs differ:

* ``proxy`` (the paper's definition, :func:`chair_proxy`): an object class mentioned in a predicted
  caption is hallucinated when none of that image's reference captions mentions it (same matcher
  over the references);
* ``instances`` (the original CHAIR, :func:`chair` with ``objects``): the image's objects are the
  classes of its COCO instance annotations (``instances_{train,val}2014.json``,
  :func:`load_instance_objects`) together with the classes its references mention.

Every mention counts (a caption that says "dog" twice has two mentions), as in the
original CHAIR: CHAIR_i = hallucinated mentions / mentions, CHAIR_s = captions with at least one
hallucinated mention / captions, both in percent.

Instance files, as the original CHAIR reads them, and where adjcap says more
(:func:`load_instance_objects`, all before any metric runs):

* an annotation whose ``image_id`` is not an integer (``"391895"``) is ignored, as the original
  ignores it (its image table is keyed by the integer ids of the caption file); the count is logged;
* an image of the run absent from every instances file is scored against its references alone, as
  the original scores it (its objects start from the captions); the count is a note in the metrics.
  A run none of whose images is in the files is refused (the wrong file, e.g. train for val);
* an annotation whose ``category_id`` no category of the file has, and a category name outside the
  CHAIR synonym lists, are refused in one line naming the file (the original stops with a KeyError).
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
# ---------------------------------------------------------------------------------------------
# vocabulary
# ---------------------------------------------------------------------------------------------

# animals whose "baby X" / "adult X" is the animal (CHAIR's animal word list), plus generic words
ANIMAL_WORDS = ("bird", "cat", "dog", "horse", "sheep", "cow", "elephant", "bear", "zebra", "giraffe", "animal", "cub")
ANIMAL_CLASSES = ("bird", "cat", "dog", "horse", "sheep", "cow", "elephant", "bear", "zebra", "giraffe")
AGE_PREFIXES = ("baby", "adult")
PASSENGER_VEHICLES = ("jet", "train")
# phrases that name no COCO object although a word in them does
BLOCKED_PHRASES = ("train track", "home plate")
# phrases mapped to a class that the synonym lists do not spell out
EXTRA_PHRASES = {"toilet seat": "toilet", "bow tie": "tie"}

_IRREGULAR_PLURALS = {
    "man": ("men",),
    "woman": ("women",),
    "person": ("people", "persons"),
    "child": ("children",),
    "grandchild": ("grandchildren",),
    "mouse": ("mice",),
    "goose": ("geese",),
    "ox": ("oxen",),
    "foot": ("feet",),
    "tooth": ("teeth",),
    "knife": ("knives",),
    "pocketknife": ("pocketknives",),
    "calf": ("calves",),
    "shelf": ("shelves",),
    "leaf": ("leaves",),
    "loaf": ("loaves",),
    "sheep": ("sheep",),
    "cattle": ("cattle",),
    "bison": ("bison",),
    "buffalo": ("buffaloes", "buffalos", "buffalo"),
    "bus": ("buses", "busses"),
}

_VOWELS = set("aeiou")
_TOKEN_RE = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")  # a hyphenated word stays one token (see the module doc)


def plural_forms(word: str) -> set[str]:
    """English plural forms of a (singular) vocabulary word, by rule plus a few irregulars."""
    w = word.lower()
    forms = {w + "s"}
    forms.update(_IRREGULAR_PLURALS.get(w, ()))
    if w.endswith("man") and len(w) > 3:
        forms.add(w[:-3] + "men")  # policeman -> policemen
    if w.endswith(("s", "x", "z", "ch", "sh")):
        forms.add(w + "es")
    if w.endswith("y") and len(w) > 1 and w[-2] not in _VOWELS:
        forms.add(w[:-1] + "ies")
    if w.endswith("o"):
        forms.add(w + "es")
    if w.endswith("fe"):
        forms.add(w[:-2] + "ves")
    elif w.endswith("f"):
        forms.add(w[:-1] + "ves")
    return forms


@dataclass(frozen=True)
class ChairVocabulary:
    classes: tuple[str, ...]  # the 80 class names, in file order (COCO category order)
    synonyms: dict[str, tuple[str, ...]]  # class -> its synonyms (deduplicated, lower-case)
    phrases: dict[tuple[str, ...], str | None]  # singular token tuple -> class (None: blocked)
    singular: dict[str, str]  # plural token -> singular vocabulary word
    max_len: int


def _synonyms_path() -> Path:
    return Path(str(resources.files("adjcap.metrics") / "resources" / "coco_synonyms.txt"))


def parse_synonyms(text: str) -> dict[str, tuple[str, ...]]:
    """CHAIR synonyms text (one class per line: "class, synonym, synonym, ...") -> dict."""
    out: dict[str, tuple[str, ...]] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        words = [" ".join(w.strip().lower().split()) for w in line.split(",")]
        words = [w for w in words if w]
        if not words:
            continue
        cls = words[0]
        if cls in out:
            raise ValueError(f"synonyms line {lineno}: class '{cls}' appears twice")
        seen: list[str] = []
        for w in words:
            if w not in seen:
                seen.append(w)
        out[cls] = tuple(seen)
    return out


@functools.lru_cache(maxsize=4)
def load_vocabulary(path: str | None = None) -> ChairVocabulary:
    """Build the matcher tables from a synonyms file (default: the shipped CHAIR lists)."""
    text = Path(path).read_text() if path else _synonyms_path().read_text()
    synonyms = parse_synonyms(text)
    phrases: dict[tuple[str, ...], str | None] = {}

    def add(phrase: str, cls: str | None, override: bool = False) -> None:
        key = tuple(phrase.split())
        if override or key not in phrases:
            phrases[key] = cls

    for cls, words in synonyms.items():
        for w in words:
            add(w, cls)
    # CHAIR special cases (override the plain synonym entries)
    for prefix in AGE_PREFIXES:
        for animal in ANIMAL_WORDS:
            add(f"{prefix} {animal}", animal if animal in synonyms else None, override=True)
        for cls in ANIMAL_CLASSES:
            for w in synonyms.get(cls, ()):
                if " " not in w:
                    add(f"{prefix} {w}", cls, override=True)
    for v in PASSENGER_VEHICLES:
        target = next((c for c, ws in synonyms.items() if v in ws), None)
        add(f"passenger {v}", target, override=True)
    for p, cls in EXTRA_PHRASES.items():
        if cls in synonyms:
            add(p, cls, override=True)
    for p in BLOCKED_PHRASES:
        add(p, None, override=True)

    # singulariser: every plural form of every word used in a phrase maps back to the word;
    # words that are vocabulary entries themselves ("skis", "scissors", "people") stay as they are
    words = {t for key in phrases for t in key}
    singular: dict[str, str] = {}
    for w in sorted(words):
        for p in sorted(plural_forms(w)):
            if p != w and p not in words:
                singular.setdefault(p, w)
    return ChairVocabulary(
        classes=tuple(synonyms),
        synonyms=synonyms,
        phrases=phrases,
        singular=singular,
        max_len=max(len(k) for k in phrases),
    )


# ---------------------------------------------------------------------------------------------
# matching
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mention:
    text: str  # the matched (singularised) word or phrase
    cls: str  # the COCO class
    position: int  # token index in the caption


class ChairMatcher:
    """Find COCO-class mentions in captions."""

    def __init__(self, vocabulary: ChairVocabulary | None = None):
        self.vocab = vocabulary or load_vocabulary()

    def tokens(self, caption: str) -> list[str]:
        """Lower-cased word tokens with plurals of vocabulary words singularised."""
        toks = _TOKEN_RE.findall(caption.lower())
        return [self.vocab.singular.get(t, t) for t in toks]

    def mentions(self, caption: str) -> list[Mention]:
        toks = self.tokens(caption)
        phrases = self.vocab.phrases
        out: list[Mention] = []
        i = 0
        while i < len(toks):
            for n in range(min(self.vocab.max_len, len(toks) - i), 0, -1):
                key = tuple(toks[i : i + n])
                if key in phrases:
                    cls = phrases[key]
                    if cls is not None:
                        out.append(Mention(" ".join(key), cls, i))
                    i += n
                    break
            else:
                i += 1
        # "the seat of the toilet": with a toilet in the caption, a bare "seat" is not a chair
        if "toilet" in toks:
            out = [m for m in out if m.text != "seat"]
        return out

    def classes(self, caption: str) -> set[str]:
        return {m.cls for m in self.mentions(caption)}


# ---------------------------------------------------------------------------------------------
# the proxy metric
# ---------------------------------------------------------------------------------------------


@dataclass
class ChairResult:
    chair_s: float  # % captions with >= 1 hallucinated object
    chair_i: float  # % of object mentions that are hallucinated
    n_captions: int
    n_captions_hallucinated: int
    n_mentioned: int
    n_hallucinated: int
    per_class: dict[str, dict[str, int]] = field(default_factory=dict)  # class -> mentioned, hallucinated
    per_image: dict[Hashable, dict[str, list[str]]] = field(default_factory=dict)
    ground_truth: str = "proxy"  # a key of GROUND_TRUTHS
    n_without_instances: int = 0  # instances: images no instances file has (scored against their references)
    n_objects: int = 0  # ground-truth object classes, summed over images
    n_recalled: int = 0  # of them, the classes the caption mentions

    @property
    def recall(self) -> float:
        """% of the images' ground-truth object classes the captions mention (the LVLM protocol's recall)."""
        return 100.0 * self.n_recalled / self.n_objects if self.n_objects else 0.0

    def to_dict(self, per_image: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "CHAIR_s": self.chair_s,
            "CHAIR_i": self.chair_i,
            "n_captions": self.n_captions,
            "n_captions_hallucinated": self.n_captions_hallucinated,
            "n_mentioned": self.n_mentioned,
            "n_hallucinated": self.n_hallucinated,
            "per_class": self.per_class,
            "ground_truth": self.ground_truth,
            "recall": self.recall,
            "n_objects": self.n_objects,
            "n_recalled": self.n_recalled,
        }
        if self.ground_truth == "instances":
            out["n_without_instances"] = self.n_without_instances
        if per_image:
            out["per_image"] = {str(k): v for k, v in self.per_image.items()}
        return out


GROUND_TRUTHS = {"proxy": "the image's reference captions (the paper's proxy)",
                 "instances": "COCO instance annotations + the reference captions (Rohrbach et al. 2018)"}


def chair(
    predictions: Mapping[Hashable, str],
    references: Mapping[Hashable, Sequence[str]],
    *,
    objects: Mapping[Hashable, set[str]] | None = None,
    matcher: ChairMatcher | None = None,
    on_missing: str = "error",
) -> ChairResult:
    """CHAIR of {id: caption} against {id: [references]}; ``objects`` ({id: COCO class names}, e.g. from
    :func:`load_instance_objects`) adds the annotated objects to each image's ground truth (the
    original CHAIR); without it the ground truth is the references alone (the paper's proxy). An
    image missing from ``objects`` is scored against its references alone, as the original CHAIR
    scores an image its instances files lack (counted: ``n_without_instances``)."""
    from adjcap.metrics.coco import align

    preds, refs, _ = align(predictions, references, on_missing)  # type: ignore[arg-type]
    m = matcher or ChairMatcher()
    without = 0
    if objects is not None:
        without = sum(i not in objects for i in preds)
        unknown = set().union(*objects.values()) - set(m.vocab.classes) if objects else set()
        if unknown:
            raise ValueError(f"instance classes not in the CHAIR vocabulary: {sorted(unknown)[:5]}")
    per_class: dict[str, dict[str, int]] = {}
    per_image: dict[Hashable, dict[str, list[str]]] = {}
    n_ment = n_hall = n_caps_hall = n_obj = n_rec = 0
    for i, cap in preds.items():
        truth: set[str] = set(objects.get(i, ())) if objects is not None else set()
        for r in refs[i]:
            truth |= m.classes(r)
        mentions = m.mentions(cap)
        hall = [x.cls for x in mentions if x.cls not in truth]
        for x in mentions:
            d = per_class.setdefault(x.cls, {"mentioned": 0, "hallucinated": 0})
            d["mentioned"] += 1
            if x.cls not in truth:
                d["hallucinated"] += 1
        n_ment += len(mentions)
        n_hall += len(hall)
        n_caps_hall += bool(hall)
        n_obj += len(truth)
        n_rec += len(truth & {x.cls for x in mentions})  # each ground-truth class once, however often named
        per_image[i] = {"mentioned": [x.cls for x in mentions], "hallucinated": hall, "objects": sorted(truth)}
    n = len(preds)
    order = {c: k for k, c in enumerate(m.vocab.classes)}
    per_class = dict(sorted(per_class.items(), key=lambda kv: order.get(kv[0], len(order))))
    return ChairResult(
        chair_s=100.0 * n_caps_hall / n if n else 0.0,
        chair_i=100.0 * n_hall / n_ment if n_ment else 0.0,
        n_captions=n,
        n_captions_hallucinated=n_caps_hall,
        n_mentioned=n_ment,
        n_hallucinated=n_hall,
        per_class=per_class,
        per_image=per_image,
        ground_truth="proxy" if objects is None else "instances",
        n_without_instances=without,
        n_objects=n_obj,
        n_recalled=n_rec,
    )


def chair_proxy(
    predictions: Mapping[Hashable, str],
    references: Mapping[Hashable, Sequence[str]],
    *,
    matcher: ChairMatcher | None = None,
    on_missing: str = "error",
) -> ChairResult:
    """The paper's reference-proxy CHAIR: :func:`chair` with the references as the only ground truth."""
    return chair(predictions, references, matcher=matcher, on_missing=on_missing)


def _is_id(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _read_instances(path: Path, vocabulary: ChairVocabulary) -> dict[int, set[str]]:
    """One COCO instances file -> {integer image id: its CHAIR classes}; one-line ValueError naming
    the file for what the original CHAIR could not read either."""
    import json

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such COCO instances file; `adjcap prepare coco-instances` "
                                "fetches instances_{train,val}2014.json") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a COCO instances file (not JSON: {str(e).splitlines()[0]})") from None
    shape = ("expected 'images' (id), 'annotations' (image_id, category_id) and 'categories' (id, name)")
    if not isinstance(data, dict) or not all(isinstance(data.get(k), list) for k in ("images", "annotations",
                                                                                     "categories")):
        raise ValueError(f"{path}: not a COCO instances file; {shape}")
    names: dict[int, str] = {}
    for k, c in enumerate(data["categories"]):
        if not isinstance(c, dict) or not _is_id(c.get("id")) or not isinstance(c.get("name"), str):
            raise ValueError(f"{path}: categories[{k}] is not {{\"id\": integer, \"name\": string}} ({str(c)[:60]})")
        names[c["id"]] = c["name"]
    classes: dict[int, set[str]] = {}
    for im in data["images"]:
        if isinstance(im, dict) and _is_id(im.get("id")):
            classes.setdefault(im["id"], set())
    ignored = 0
    used: set[int] = set()
    for k, a in enumerate(data["annotations"]):
        if not isinstance(a, dict) or "image_id" not in a or "category_id" not in a:
            raise ValueError(f"{path}: annotations[{k}] has no image_id and category_id; {shape}")
        if not _is_id(a["image_id"]):  # the original CHAIR ignores it (no such integer image)
            ignored += 1
            continue
        cid = a["category_id"]
        if not _is_id(cid) or cid not in names:
            known = f"{min(names)}..{max(names)}" if names else "none"
            raise ValueError(f"{path}: annotations[{k}] (image {a['image_id']}) has category_id {cid!r}, which no "
                             f"category of the file has (its category ids: {known}); use the COCO instances file "
                             "as released")
        used.add(cid)
        classes.setdefault(a["image_id"], set()).add(names[cid])
    outside = sorted({names[c] for c in used} - set(vocabulary.classes))
    if outside:
        from adjcap.data.records import offenders

        raise ValueError(f"{path}: categories {offenders(outside, first=3)} are not CHAIR classes (the synonym "
                         "lists of adjcap/metrics/resources/coco_synonyms.txt name COCO's 80); use the COCO 2014 "
                         "instances files")
    if ignored:
        log.warning(f"{path}: {ignored} annotation(s) with a non-integer image_id ignored, as the original CHAIR "
                    "ignores them")
    return classes


def load_instance_objects(paths: Sequence[str | Path], image_ids: Mapping[Hashable, int] | None = None,
                          vocabulary: ChairVocabulary | None = None) -> dict[Hashable, set[str]]:
    """COCO instance annotation files (``instances_val2014.json``, ...) -> {image: its object classes},
    every file checked whole before any metric runs (the module's doc lists the rules). ``image_ids``
    maps the caller's image ids to COCO image ids (the benchmark's ``coco_id``); without it the keys
    are the COCO ids. Every image of the files is present, an image without annotations with an empty
    set; an image of ``image_ids`` no file has is left out (:func:`chair` scores it against its
    references, as the original CHAIR does), unless none is there: then the files are refused."""
    vocab = vocabulary or load_vocabulary()
    classes: dict[int, set[str]] = {}
    for path in paths:
        for i, c in _read_instances(Path(path), vocab).items():
            classes.setdefault(i, set()).update(c)
    if image_ids is None:
        return dict(classes)
    present = {i: classes[int(c)] for i, c in image_ids.items() if int(c) in classes}
    if image_ids and not present:
        first = next(iter(image_ids))
        raise ValueError(f"none of the {len(image_ids)} images is in {', '.join(str(p) for p in paths)} (e.g. "
                         f"{first!r}, COCO id {image_ids[first]}): the wrong instances file? (eval.coco_instances; "
                         "the Karpathy splits' images are all in instances_val2014.json)")
    return present

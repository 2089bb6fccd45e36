"""Retrieval corpus: IFCap's normalisation (its official code's), stable ids, fingerprint."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from adjcap.data import Corpus, DataError, corpus_fingerprint, load_corpus, normalize_caption

FIX = Path(__file__).parent / "fixtures" / "data"
COCO_IFCAP = FIX / "coco_test_captions.json"


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("A man with a red helmet on a small moped on a dirt road. ", "A man with a red helmet on a small moped on a dirt road."),
        ("  a man riding a bike ", "A man riding a bike."),
        ("THERE ARE DIFFERENT KITES FLYING IN THE SKY", "There are different kites flying in the sky."),
        ("ONIONS, TOMATOES AND OLIVES ATOP A PLATE.", "Onions, tomatoes and olives atop a plate."),
        ("A BMW parked by the curb", "A BMW parked by the curb."),  # not entirely upper-case
        ("A dog!", "A dog!"),
        ("Is that a cat?", "Is that a cat?"),
        ('He said "cheese"', 'He said "cheese"'),  # '"' is punctuation
        ("a plate of food)", "A plate of food)"),
        ("two dogs playing 2", "Two dogs playing 2."),
        ("123", "123."),  # no cased character: not "upper-case"
        ("élan on a bike", "Élan on a bike."),
        ("a\ttab inside", "A\ttab inside."),  # inner whitespace is kept
        ("\n  A cat.\n", "A cat."),
        ("", ""),
        ("   ", ""),
        ("x", "X."),
        ("I", "I."),  # "I".isupper() -> lower -> upper first char
    ],
)
def test_normalize_caption(raw: str, expected: str):
    assert normalize_caption(raw) == expected
    assert normalize_caption(normalize_caption(raw)) == expected  # idempotent


def test_load_ifcap_corpus_real_excerpt():
    c = load_corpus(COCO_IFCAP, fmt="ifcap")
    raw = [x for caps in json.loads(COCO_IFCAP.read_text()).values() for x in caps]
    assert len(c) == len(raw) == 121
    assert c.texts == [normalize_caption(x) for x in raw]  # flattened in file order
    assert c.texts[0] == "A man with a red helmet on a small moped on a dirt road."
    assert c.ids.dtype == np.int64 and np.array_equal(c.ids, np.arange(121))
    assert c.source == str(COCO_IFCAP) and c.dropped == 0
    # upper-case captions of image 59 of the excerpt were lower-cased
    assert not any(t.isupper() for t in c.texts)
    assert all(t[-1] in ".!?\"')" or not t[-1].isalnum() for t in c.texts)


def test_fingerprint_definition_and_stability():
    c1 = load_corpus(COCO_IFCAP)
    c2 = load_corpus(COCO_IFCAP)
    assert c1.fingerprint == c2.fingerprint
    expected = hashlib.sha256("\x00".join(c1.texts).encode("utf-8")).hexdigest()[:16]
    assert c1.fingerprint == expected == corpus_fingerprint(c1.texts)
    # pinned: a change in normalisation, order or reading changes the index address
    assert c1.fingerprint == "b376d48c0a9cb96e"
    swapped = list(c1.texts)
    swapped[0], swapped[1] = swapped[1], swapped[0]
    assert corpus_fingerprint(swapped) != c1.fingerprint
    edited = list(c1.texts)
    edited[-1] = edited[-1] + " "
    assert corpus_fingerprint(edited) != c1.fingerprint
    # text boundaries matter: ["ab", "c"] != ["a", "bc"]
    assert corpus_fingerprint(["ab", "c"]) != corpus_fingerprint(["a", "bc"])


def test_same_texts_same_fingerprint_across_formats(tmp_path: Path):
    raw = [x for caps in json.loads(COCO_IFCAP.read_text()).values() for x in caps]
    lines = tmp_path / "corpus.txt"
    lines.write_text("\n".join(raw) + "\n\n", encoding="utf-8")
    lst = tmp_path / "corpus.json"
    lst.write_text(json.dumps(raw))
    ref = load_corpus(COCO_IFCAP)
    assert load_corpus(lines, fmt="lines").fingerprint == ref.fingerprint
    assert load_corpus(lines, fmt="auto").fingerprint == ref.fingerprint
    assert load_corpus(lst, fmt="ifcap").fingerprint == ref.fingerprint


def test_karpathy_corpus_is_train_plus_restval(tmp_path: Path):
    images = [
        {"filename": "a.jpg", "split": "train", "sentences": [{"raw": "a dog runs"}, {"raw": "A DOG"}]},
        {"filename": "b.jpg", "split": "test", "sentences": [{"raw": "a test caption"}]},
        {"filename": "c.jpg", "split": "restval", "sentences": [{"tokens": ["a", "cat", "sits"]}]},
        {"filename": "d.jpg", "split": "val", "sentences": [{"raw": "a val caption"}]},
    ]
    p = tmp_path / "dataset_coco.json"
    p.write_text(json.dumps({"images": images}))
    c = load_corpus(p, fmt="karpathy", split="train")
    assert c.texts == ["A dog runs.", "A dog.", "A cat sits."]
    assert load_corpus(p, fmt="auto").texts == c.texts
    assert load_corpus(p, fmt="karpathy", split="val").texts == ["A val caption."]
    with pytest.raises(DataError, match="no images in split 'nope'"):
        load_corpus(p, fmt="karpathy", split="nope")
    with pytest.raises(DataError, match="corpus format 'ifcap' expects"):
        load_corpus(p, fmt="ifcap")


def test_empty_captions_dropped_and_counted():
    c = Corpus.from_texts(["a cat", "  ", "", "a dog"])
    assert c.texts == ["A cat.", "A dog."] and c.dropped == 2
    assert np.array_equal(c.ids, [0, 1])


def test_corpus_errors(tmp_path: Path):
    with pytest.raises(DataError, match=r"corpus file not found.*benchmarks\.<name>\.corpus"):
        load_corpus(tmp_path / "train_captions.json")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    with pytest.raises(DataError, match="no non-empty captions"):
        load_corpus(empty, fmt="lines")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"a.jpg": ["ok"], "b.jpg": [1]}))
    with pytest.raises(DataError, match=r"lists of strings.*'b\.jpg'"):
        load_corpus(bad)
    with pytest.raises(DataError, match="unknown corpus format"):
        load_corpus(COCO_IFCAP, fmt="csv")
    broken = tmp_path / "broken.json"
    broken.write_text('{"a.jpg": ["x"')
    with pytest.raises(DataError, match="not valid JSON"):
        load_corpus(broken)


def test_large_corpus_loads(tmp_path: Path):
    # 100K captions in IFCap layout: exercises the fast path (no timing assertion)
    caps = {f"COCO_train2014_{i:012d}.jpg": [f"a photo number {i} of a cat", f"A DOG {i}"] for i in range(50_000)}
    p = tmp_path / "train_captions.json"
    p.write_text(json.dumps(caps))
    c = load_corpus(p)
    assert len(c) == 100_000 and c.ids[-1] == 99_999
    assert c.texts[0] == "A photo number 0 of a cat." and c.texts[1] == "A dog 0."

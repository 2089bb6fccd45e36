"""The fast open_clip tokenizers (adjcap.models.clip_tokens) give open_clip's own ids on every caption:
the demo corpus, the test fixtures, and seeded hostile text (unicode, html entities, emoji, control characters,
special-token names, very long, empty)."""

import json
import random
from pathlib import Path

import open_clip
import pytest
import torch
from open_clip import tokenizer as oc

from adjcap.models.clip_tokens import FastClipTokenizer, fast_tokenizer, is_plain

ROOT = Path(__file__).resolve().parents[1]

WORDS = ["a", "man", "riding", "wave", "on", "top", "of", "surfboard", "two", "dogs", "playing", "in", "the",
         "snow", "giraffe", "standing", "next", "to", "tree", "kitchen", "with", "stainless", "steel", "appliances"]
PIECES = [
    # punctuation, contractions, numbers, case
    ".", ",", "!!", "?!", "...", "--", "(", ")", "[x]", "{y}", "/", "\\", "@#$%^*", "'s", "'T", "DON'T", "it's",
    "THEY'LL", "we've", "I'm", "you'd", "3.14", "1,000", "2024", "x2", "MiXeD", "CamelCase", "ALLCAPS", "_", "~`",
    # html entities and markup
    "&amp;", "&lt;b&gt;", "&#39;", "&quot;", "&nbsp;", "&amp;amp;", "&copy", "<b>bold</b>", "&#x1F600;", "& ",
    # unicode: accents, scripts, combining marks, width, ligatures, quotes, mojibake, digits
    "café", "naïve", "Ünïcødé", "東京", "Москва", "مرحبا", "e\u0301", "\u200bzero\u200dwidth", "ＦＵＬＬ", "ﬁsh",
    "\u2018quoted\u2019", "\u201cdouble\u201d", "Ã©", "â€™", "²", "٣", "½", "Ⅻ", "ß", "İstanbul", "ǅ", "ﬀ",
    # emoji: single, skin tone, ZWJ family, flag, keycap
    "🙂", "👍🏽", "👨\u200d👩\u200d👧", "🇫🇷", "1\ufe0f\u20e3", "🐶🐱",
    # whitespace and control characters
    "\t", "\n", "\r\n", "\u00a0", "\u2003", "\x0b", "\x0c", "\x1c", "\x00", "\x1b[31m", "\x7f", "\u0085",
    # the tokenizer's special tokens written in text
    "<start_of_text>", "<END_OF_TEXT>", "</w>",
]


def hostile_captions(n: int, seed: int = 0) -> list[str]:
    """``n`` seeded captions: mostly COCO-like words mixed with the pieces above; some empty, some very long."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kind = rng.random()
        if kind < 0.02:
            out.append(rng.choice(["", " ", "\n", "&", "\u200b"]))
            continue
        length = rng.randint(80, 300) if kind < 0.05 else rng.randint(1, 20)
        parts = [rng.choice(PIECES) if rng.random() < 0.3 else rng.choice(WORDS) for _ in range(length)]
        if rng.random() < 0.3:
            parts = [p.upper() if rng.random() < 0.5 else p.capitalize() for p in parts]
        sep = rng.choice([" ", " ", " ", "", "  ", " \t"])
        out.append(sep.join(parts))
    return out


def _strings(obj, out: list[str]) -> None:
    if isinstance(obj, str):
        out.append(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _strings(v, out)
    elif isinstance(obj, list):
        for v in obj:
            _strings(v, out)


def corpus_captions(demo_cfg) -> list[str]:
    """Every string of the demo world's annotations and of the test fixtures' JSON files."""
    demo = Path(demo_cfg.paths.cache_dir) / "demo" / "annotations"
    texts = (demo / "alt_captions.txt").read_text().splitlines()
    for p in sorted([*demo.glob("*.json"), *(ROOT / "tests" / "fixtures").rglob("*.json")]):
        _strings(json.loads(p.read_text()), texts)
    return texts


def assert_same(reference, texts: list[str]) -> FastClipTokenizer | object:
    fast = fast_tokenizer(reference)
    assert fast is not reference
    want, got = reference(texts), fast(texts)
    bad = [t for t, a, b in zip(texts, want, got) if not torch.equal(a, b)]
    assert not bad, f"{len(bad)} captions differ, e.g. {bad[:3]!r}"
    return fast


def test_same_ids_on_demo_corpus_fixtures_and_hostile_text(demo_cfg):
    texts = corpus_captions(demo_cfg)
    assert len(texts) > 5000
    hostile = hostile_captions(1000, seed=1)
    fast = assert_same(open_clip.get_tokenizer("adjcap-tiny-clip"), texts + hostile)  # the demo's tokenizer
    # only a caption that is not ASCII after cleaning, or names a special token, leaves the fast path
    leave = sum(1 for t in texts + hostile if not fast.clean(t).isascii() or "_of_text>" in fast.clean(t).lower())
    assert fast.fallbacks == leave and leave < len(hostile)
    ascii_plain = [t for t in texts if is_plain(t)]
    assert len(ascii_plain) > 0.9 * len(texts)  # the corpus takes the fast path


def test_truncation_and_context_length():
    ref = oc.SimpleTokenizer(context_length=16)
    texts = ["word " * n for n in (0, 13, 14, 15, 40)] + ["&amp; " * 20]
    fast = assert_same(ref, texts)
    assert torch.equal(ref(texts, context_length=8), fast(texts, context_length=8))
    assert fast(texts)[-2, -1].item() == ref.eot_token_id


@pytest.mark.parametrize("clean", ["canonicalize", "whitespace", "lower"])
def test_hf_tokenizer_cleaning(demo_cfg, clean):
    """An open_clip HFTokenizer (SigLIP's kind) keeps its Rust tokenizer; only the cleaning is made fast."""
    tok = oc.HFTokenizer(str(Path(demo_cfg.paths.cache_dir) / "tiny" / "blip-itm"), context_length=24, clean=clean)
    assert_same(tok, hostile_captions(400, seed=2) + corpus_captions(demo_cfg)[:200])


def test_unknown_tokenizers_are_left_alone():
    masked = oc.SimpleTokenizer(reduction_mask="simple")
    extra = oc.SimpleTokenizer(additional_special_tokens=["<x>"])
    assert fast_tokenizer(masked) is masked and fast_tokenizer(extra) is extra
    assert fast_tokenizer(None) is None


@pytest.mark.slow
def test_same_ids_on_100k_generated_captions():
    ref = open_clip.get_tokenizer("ViT-B-32")
    texts = hostile_captions(100_000, seed=0)
    fast = fast_tokenizer(ref)
    for i in range(0, len(texts), 10_000):  # chunks: a failure names its caption
        chunk = texts[i:i + 10_000]
        want, got = ref(chunk), fast(chunk)
        bad = [t for t, a, b in zip(chunk, want, got) if not torch.equal(a, b)]
        assert not bad, f"{len(bad)} captions differ, e.g. {bad[:3]!r}"
    assert 0 < fast.fallbacks < len(texts)

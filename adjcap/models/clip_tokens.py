"""open_clip's tokenizers, the same ids, without open_clip's per-caption Python.

open_clip's ``SimpleTokenizer`` spends 60-250 us of one CPU thread per caption: ``ftfy.fix_text``, two
``html.unescape``, a Python regex and a Python BPE. :func:`fast_tokenizer` wraps the loaded tokenizer:

* **cleaning**: open_clip's clean functions all start with ``basic_clean`` (ftfy, html unescape, strip).
  On a *plain* caption (printable ASCII, tab/newline/CR, no ``&``) that is ``str.strip``: ftfy changes no
  printable ASCII except control characters and ``&``-entities, html.unescape needs an ``&``. Such a caption
  gets the clean function's own tail (``whitespace_clean``, ``lower``, ``canonicalize_text``); any other
  caption gets open_clip's clean function itself.
* **split and BPE** (``SimpleTokenizer`` only): a cleaned caption that is ASCII and names no special token
  is split by the reference's pattern written for ASCII (``\\p{L}`` is ``[a-z]``, ``\\p{N}`` ``[0-9]`` there)
  in the C ``re``, and each distinct word is BPE'd once by the reference's own ``bpe`` and then looked up
  in a word cache. Any other caption is encoded by the reference ``SimpleTokenizer.encode`` (counted in
  :attr:`FastClipTokenizer.fallbacks`). About 10 us per caption instead of 60-250; a Rust ``tokenizers``
  BPE built from the same vocabulary measured slower here (its regex split and per-caption ``Encoding``
  objects: 40-100 us), so it is not used.
* ``HFTokenizer`` (SigLIP, ...) already runs Rust; only its cleaning is made fast.

Ids are those of the wrapped tokenizer on every input (tests/test_clip_tokens.py checks the demo corpus,
the fixtures and 100,000 generated hostile captions). A tokenizer this module does not know (another class,
a reduction mask, extra special tokens, an unknown clean function) is returned unwrapped.
"""

from __future__ import annotations

import copy
import re
from typing import Any, Callable, Sequence

import numpy as np
import torch
from open_clip import tokenizer as oc

# the reference's pattern (open_clip's SimpleTokenizer.pat, IGNORECASE) on ASCII text: \p{L} is [a-z],
# \p{N} is [0-9], \s is [ \t\n\r\f\v] there; its special tokens are left to the reference
_ASCII_WORDS = re.compile(r"'(?:[stmd]|re|ve|ll)|[a-z]+|[0-9]|[^\sa-z0-9]+", re.ASCII | re.IGNORECASE)
# printable ASCII, tab, newline, carriage return, and no '&' (an html entity's start)
_PLAIN = re.compile(r"[\t\n\r\x20-\x25\x27-\x7e]*")
_SPECIAL = re.compile(r"<(start|end)_of_text>", re.IGNORECASE)


def is_plain(text: str) -> bool:
    """True when open_clip's ``basic_clean`` is ``str.strip`` on this text."""
    return _PLAIN.fullmatch(text) is not None


# open_clip's clean function -> what it does after basic_clean (on an already basic-clean text)
_TAILS: dict[Callable, Callable[[str], str]] = {
    oc._clean_lower: lambda s: oc.whitespace_clean(s).lower(),
    oc._clean_whitespace: oc.whitespace_clean,
    oc._clean_canonicalize: oc.canonicalize_text,
}


class FastClean:
    """An open_clip clean function, with ftfy and html.unescape skipped on plain text (same output)."""

    def __init__(self, reference: Callable[[str], str]):
        self.reference = reference
        self.tail = _TAILS[reference]

    def __call__(self, text: str) -> str:
        return self.tail(text.strip()) if is_plain(text) else self.reference(text)


class FastClipTokenizer:
    """open_clip's ``SimpleTokenizer`` ids, cleaned fast, split by a C regex, BPE'd once per distinct word."""

    MAX_WORDS = 1_000_000  # the word cache is cleared when it grows past this (hostile input)

    def __init__(self, reference: oc.SimpleTokenizer):
        self.reference = reference
        self.context_length = reference.context_length
        self.sot_token_id = reference.sot_token_id
        self.eot_token_id = reference.eot_token_id
        self.vocab_size = reference.vocab_size
        self.clean = FastClean(reference.clean_fn)
        self.words: dict[str, list[int]] = {}
        self.calls = 0
        self.fallbacks = 0  # captions encoded by the reference (non-ASCII after cleaning, special tokens)

    def _word(self, word: str) -> list[int]:
        ref = self.reference
        if len(self.words) >= self.MAX_WORDS:
            self.words.clear()
        token = "".join(ref.byte_encoder[b] for b in word.encode("utf-8"))
        ids = self.words[word] = [ref.encoder[t] for t in ref.bpe(token).split(" ")]
        return ids

    def encode(self, text: str) -> list[int]:
        """One text -> BPE ids without start/end tokens, as ``SimpleTokenizer.encode``."""
        self.calls += 1
        clean = self.clean(text)
        if not clean.isascii() or _SPECIAL.search(clean):
            self.fallbacks += 1
            return self.reference.encode(text)
        words, out = self.words, []
        for w in _ASCII_WORDS.findall(clean):
            ids = words.get(w)
            out.extend(ids if ids is not None else self._word(w))
        return out

    def ids(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    def __call__(self, texts: str | Sequence[str], context_length: int | None = None) -> torch.Tensor:
        texts = [texts] if isinstance(texts, str) else list(texts)
        ctx = int(context_length or self.context_length)
        result = np.zeros((len(texts), ctx), dtype=np.int64)
        for row, ids in zip(result, self.ids(texts)):
            n = min(len(ids), ctx - 2)
            row[0] = self.sot_token_id
            row[1:n + 1] = ids[:n]
            row[n + 1] = self.eot_token_id  # the reference truncates to ctx and puts EOT last
        return torch.from_numpy(result)


def fast_tokenizer(tok: Any) -> Any:
    """``tok`` (an open_clip tokenizer) made fast with the same ids, or ``tok`` itself when unknown."""
    if getattr(tok, "clean_fn", None) not in _TAILS or getattr(tok, "reduction_fn", None) is not None:
        return tok
    if type(tok) is oc.SimpleTokenizer:
        if len(tok.all_special_ids) != 2:
            return tok
        return FastClipTokenizer(tok)
    if type(tok) is oc.HFTokenizer:
        fast = copy.copy(tok)  # the wrapped HF tokenizer is shared, only the clean function differs
        fast.clean_fn = FastClean(tok.clean_fn)
        return fast
    return tok

"""How a judge cuts a long candidate: the text window of each verifier family and a count of the
candidates that do not fit it. A "describe in detail" caption of a vision-language model (hundreds of
tokens) is longer than every judge reads:

* ``blip_itm`` / ``blip2_itm``: BERT word pieces, [CLS] / [ENC] ... [SEP], truncated at
  ``verifier.max_text_tokens`` (35, as LAVIS): the judge scores the caption's first ~33 word pieces;
* ``clip``: the open_clip tokenizer's context (CLIP 77 tokens with start and end, SigLIP 64): the text is
  cut at the window, the rest unseen.

The same judges score the candidates in stage 4 (:mod:`adjcap.engine.stages`): what lies past the window does
not count, so a hallucinated object late in a long caption goes unjudged; the count says how often.

``verifier.long_captions`` says how the judge reads a candidate (stage 4, every family and backend:
:func:`judge` wraps the judge's own ``score``; stage 2 reads the retrieved corpus captions whole):

* ``whole`` (the default, as before the setting existed): the text as one caption, cut at the window;
* ``sentence_min`` / ``sentence_mean``: each sentence of the text (:func:`sentences`) judged alone, in
  the same call, and the text's score the least / the mean of its sentences' scores. ``sentence_min``
  reads a caption as only as good as its least supported sentence (one hallucinated object anywhere
  makes CHAIR_s count the caption), ``sentence_mean`` as its sentences on average. A text of one
  sentence is judged as it is, as ``whole`` judges it; a sentence longer than the window is still cut.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Callable, Sequence

import numpy as np

# a sentence ends after . ! or ? followed by white space, or at a line break (a list item, a paragraph)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\s*\n\s*")

# verifier.long_captions -> how a text's sentence scores make its score (None: the text judged whole)
AGGREGATES: dict[str, Callable[[np.ndarray], float] | None] = {
    "whole": None,
    "sentence_min": lambda x: float(np.min(x)),
    "sentence_mean": lambda x: float(np.mean(x)),
}


def sentences(text: str) -> list[str]:
    """The sentences of ``text``, in order: it is cut after ``.``, ``!`` or ``?`` followed by white
    space and at every line break, each piece stripped, empty pieces dropped (a rule, not a parser:
    "Mr. Smith" is cut after "Mr."; "3.5" and "e.g.," are not). A text of one sentence (or of none) is
    returned whole and unchanged."""
    parts = [p for p in (x.strip() for x in _SENTENCE_END.split(text)) if p]
    return parts if len(parts) > 1 else [text]


def judge(verifier: Any, memo: Any, texts: Sequence[Sequence[str]], long_captions: str = "whole") -> list:
    """``verifier.score(memo, texts)`` (per image, each text's score) read as ``long_captions`` says:
    ``whole`` is that call itself; a sentence mode scores every sentence of an image's texts in one call
    and aggregates each text's."""
    agg = AGGREGATES[long_captions]
    if agg is None:
        return verifier.score(memo, texts)
    split = [[sentences(t) for t in ts] for ts in texts]
    scores = verifier.score(memo, [[x for parts in per for x in parts] for per in split])
    out = []
    for per, got in zip(split, scores):
        got = np.asarray(got, dtype=np.float64)
        ends = np.cumsum([len(parts) for parts in per])
        out.append(np.array([agg(got[e - len(parts):e]) for parts, e in zip(per, ends)], dtype=np.float64))
    return out


def window(v: Any) -> tuple[int, str]:
    """(tokens the judge reads, how it cuts) of the verifier settings ``v``."""
    if v.family == "clip":
        return _clip_context(v.model), "open_clip tokenizer context (start + end tokens included), rest dropped"
    return int(v.max_text_tokens), "BERT word pieces with [CLS]/[SEP], truncated (LAVIS max_txt_len)"


@functools.lru_cache(maxsize=8)
def _clip_context(model: str) -> int:
    import open_clip

    tok = open_clip.get_tokenizer(model)
    return int(getattr(tok, "context_length", None) or 77)


@functools.lru_cache(maxsize=8)
def _bert(model: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model)


def token_counts(texts: Sequence[str], v: Any) -> list[int]:
    """Each text's length in the judge's tokens, special tokens included, uncut."""
    if v.family == "clip":
        import open_clip

        tok = open_clip.get_tokenizer(v.model)
        inner = getattr(tok, "tokenizer", None)  # open_clip's HFTokenizer (SigLIP) wraps a transformers one
        if inner is not None:
            return [len(inner(t)["input_ids"]) for t in texts]
        return [len(tok.encode(t)) + 2 for t in texts]  # SimpleTokenizer: + start and end
    tok = _bert(v.model)
    return [len(ids) for ids in tok(list(texts))["input_ids"]]


def cut_count(texts: Sequence[str], v: Any) -> dict[str, Any]:
    """How many of ``texts`` the judge of ``v`` cuts: {judge, window, how, long_captions, candidates,
    cut}; in a sentence mode a text is cut when one of its sentences is."""
    n, how = window(v)
    mode = getattr(v, "long_captions", "whole")
    per = [[t] if AGGREGATES[mode] is None else sentences(t) for t in texts]
    cut = 0
    if v.enabled:
        counts = token_counts([x for parts in per for x in parts], v)
        ends = np.cumsum([len(parts) for parts in per])
        cut = sum(max(counts[e - len(parts):e]) > n for parts, e in zip(per, ends))
    return {"judge": v.family, "window": n, "how": how, "long_captions": mode, "candidates": len(texts), "cut": cut}

"""How a judge cuts a long candidate: the text window of each verifier family and a count of the
candidates that do not fit it. A "describe in detail" caption of a vision-language model (hundreds of
tokens) is longer than every judge reads:

* ``blip_itm`` / ``blip2_itm``: BERT word pieces, [CLS] / [ENC] ... [SEP], truncated at
  ``verifier.max_text_tokens`` (35, as LAVIS): the judge scores the caption's first ~33 word pieces;
* ``clip``: the open_clip tokenizer's context (CLIP 77 tokens with start and end, SigLIP 64): the text is
  cut at the window, the rest unseen.

The same judges score the candidates in stage 4 (:mod:`adjcap.stages`): what lies past the window does
not count, so a hallucinated object late in a long caption goes unjudged; the count says how often.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence


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
    """How many of ``texts`` the judge of ``v`` cuts: {judge, window, how, candidates, cut}."""
    n, how = window(v)
    counts = token_counts(texts, v) if v.enabled else []
    return {"judge": v.family, "window": n, "how": how, "candidates": len(texts),
            "cut": sum(c > n for c in counts)}

"""The retrieval caption corpus: training captions, normalised exactly as IFCap does, with stable ids
and a content fingerprint (used to address the on-disk caption-embedding index)."""

from __future__ import annotations

import hashlib
import string
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

from adjcap.data.annotations import layout_of
from adjcap.data.jsonfile import load_json
from adjcap.data.layouts.karpathy import karpathy_images
from adjcap.data.records import DataError, offenders
from adjcap.registry import check

CORPUS_FORMATS = ("ifcap", "karpathy", "lines", "auto")
# IFCap tests the last character against string.punctuation plus the space character
_PUNCT = frozenset(string.punctuation + " ")


def normalize_caption(s: str) -> str:
    """IFCap's datastore normalisation (its official code's): strip; lower-case a caption that is entirely
    upper-case (``str.isupper``); upper-case the first character; append ``.`` when the last character
    is not punctuation (the set includes space). An empty caption stays empty."""
    s = s.strip()
    if not s:
        return ""
    if s.isupper():
        s = s.lower()
    s = s[0].upper() + s[1:]
    if s[-1] not in _PUNCT:
        s += "."
    return s


def corpus_fingerprint(texts: Iterable[str]) -> str:
    """sha256 (first 16 hex digits) over the texts in order, NUL-separated, UTF-8."""
    h = hashlib.sha256()
    h.update("\x00".join(texts).encode("utf-8"))
    return h.hexdigest()[:16]


@dataclass(frozen=True, eq=False)
class Corpus:
    """``texts[i]`` is caption ``ids[i] == i`` (file order); ``fingerprint`` changes whenever any text
    or the order changes; ``dropped`` counts captions that were empty after stripping."""

    texts: list[str]
    ids: np.ndarray
    fingerprint: str
    source: str
    dropped: int = 0

    def __len__(self) -> int:
        return len(self.texts)

    @classmethod
    def from_texts(cls, raw: Iterable[str], source: str = "<memory>") -> "Corpus":
        texts = []
        dropped = 0
        for c in raw:
            n = normalize_caption(c)
            if n:
                texts.append(n)
            else:
                dropped += 1
        return cls(
            texts=texts,
            ids=np.arange(len(texts), dtype=np.int64),
            fingerprint=corpus_fingerprint(texts),
            source=source,
            dropped=dropped,
        )


def _raw_ifcap(path: Path) -> list[str]:
    obj = load_json(path)
    if isinstance(obj, list) and all(isinstance(c, str) for c in obj):  # a plain JSON list of captions
        return obj
    layout = layout_of(obj, path).name
    if layout == "ifcap_nocaps":
        items = [(str(d.get("image_id")), d.get("caption")) for d in obj]
    elif layout == "ifcap":
        items = list(obj.items())
    else:
        raise DataError(
            f"{path}: corpus format 'ifcap' expects {{file name: [captions]}} (IFCap's "
            f"train_captions.json); this file has layout '{layout}'. Use corpus_format='karpathy' for a "
            "Karpathy dataset_*.json"
        )
    out: list[str] = []
    bad = []
    for key, caps in items:
        if isinstance(caps, list) and all(isinstance(c, str) for c in caps):
            out.extend(caps)
        elif isinstance(caps, str):
            out.append(caps)
        else:
            bad.append(key)
    if bad:
        raise DataError(f"{path}: captions must be lists of strings; offending keys: {offenders(bad)}")
    return out


def _raw_karpathy(path: Path, split: str) -> list[str]:
    obj = load_json(path)
    if layout_of(obj, path).name != "karpathy":
        raise DataError(f"{path}: corpus format 'karpathy' expects a Karpathy dataset_*.json")
    out: list[str] = []
    bad = []
    for im in karpathy_images(obj, path, split):
        sents = im.get("sentences")
        if not isinstance(sents, list):
            bad.append(str(im["filename"]))
            continue
        for st in sents:
            raw = st.get("raw") if isinstance(st, dict) else None
            if isinstance(raw, str):
                out.append(raw)
            elif isinstance(st, dict) and isinstance(st.get("tokens"), list):
                out.append(" ".join(map(str, st["tokens"])))
            else:
                bad.append(str(im["filename"]))
    if bad:
        raise DataError(f"{path}: images whose sentences have no 'raw' text: {offenders(list(dict.fromkeys(bad)))}")
    return out


def _raw_lines(path: Path) -> list[str]:
    if not path.is_file():
        raise DataError(f"{path}: corpus file not found; check the corpus path (--set benchmarks.<name>.corpus=FILE)")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 text ({e}); a 'lines' corpus is one caption per line") from e
    return text.splitlines()


def load_corpus(path: str | Path, fmt: str = "ifcap", split: str = "train") -> Corpus:
    """Load and normalise the retrieval corpus.

    ``fmt``: ``ifcap`` (``{file name: [captions]}``, flattened in file order; a plain JSON list of
    strings is accepted too), ``karpathy`` (the sentences of ``split``; ``train`` = train + restval),
    ``lines`` (one caption per line; blank lines are skipped) or ``auto`` (``.txt`` -> lines, else by
    content). Empty captions are dropped (counted in ``Corpus.dropped``); an empty corpus is an error.
    """
    p = Path(path).expanduser()
    check(fmt, CORPUS_FORMATS, "corpus format", DataError)
    if not p.exists():
        raise DataError(
            f"{p}: corpus file not found. It holds the training captions retrieval searches "
            "(IFCap: annotations/<dataset>/train_captions.json); set its path with "
            "--set benchmarks.<name>.corpus=FILE"
        )
    if fmt == "auto":
        if p.suffix.lower() == ".txt":
            fmt = "lines"
        else:
            obj = load_json(p)
            fmt = "karpathy" if isinstance(obj, dict) and layout_of(obj, p).name == "karpathy" else "ifcap"
    if fmt == "ifcap":
        raw = _raw_ifcap(p)
    elif fmt == "karpathy":
        raw = _raw_karpathy(p, split)
    else:
        raw = _raw_lines(p)
    corpus = Corpus.from_texts(raw, source=str(p))
    if not corpus.texts:
        raise DataError(f"{p}: the corpus has no non-empty captions")
    return corpus

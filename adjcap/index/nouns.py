"""The corpus captions' nouns, tagged once per corpus and tagger and kept with the index (issue 38 item 5).

Stage 3's frequency entity filter counts the noun lemmas of an image's k verified (or L retrieved)
corpus captions (:func:`adjcap.models.entities.count_tagged`). Those captions come from a fixed corpus, so each
caption's noun lemmas are the same for every image: :func:`ensure_nouns` tags the whole corpus once
(outside the GPU actors: `adjcap encode-corpus`, the job's index step, the in-process pipeline) into
``<index dir>/nouns-<key>.npz``, keyed by everything that made it (the corpus fingerprint and the
tagger: NLTK's version and data, or the lexicon file's content), and :class:`CorpusNouns` counts an
image's pool from it by corpus id, exactly as tagging its captions would (the same occurrences, the
same (count, lemma) order).

File: ``vocab`` (the lemmas, unicode), ``offsets`` int64 [n + 1] and ``lemmas`` int32 (caption ``i``'s
lemma occurrences are ``lemmas[offsets[i]:offsets[i + 1]]``, in text order), ``key`` (what made it).
"""

from __future__ import annotations

import hashlib
import io
import logging
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from adjcap.models import entities as ent
from adjcap.storage.content_ids import file_content_id
from adjcap.storage.io import atomic_write_bytes

log = logging.getLogger(__name__)


def tagger_identity(spec: str) -> str:
    """What decides a tagger's nouns: NLTK's version and its tagger / lemmatiser data, or a lexicon's content."""
    if spec == "nltk":
        import nltk

        found = []
        for name, paths in ent.NLTK_RESOURCES.items():
            for p in paths:
                try:
                    found.append(f"{name}={Path(nltk.data.find(p)).name}")
                    break
                except LookupError:
                    continue
        return f"nltk-{nltk.__version__}:{','.join(found)}"
    return f"lexicon:{file_content_id(Path(spec))}"


def nouns_file(index_dir: str | Path, fingerprint: str, spec: str) -> tuple[Path, str]:
    """(the file, its key) of a corpus's nouns under a tagger, in the index's directory."""
    key = f"{fingerprint}|{tagger_identity(spec)}"
    return Path(index_dir) / f"nouns-{hashlib.sha256(key.encode()).hexdigest()[:16]}.npz", key


class CorpusNouns:
    """Every corpus caption's noun lemmas (occurrences), by corpus id."""

    def __init__(self, vocab: Sequence[str], offsets: np.ndarray, lemmas: np.ndarray, key: str = ""):
        self.vocab, self.offsets, self.lemmas, self.key = list(vocab), offsets, lemmas, key

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def of(self, corpus_id: int) -> list[str]:
        return [self.vocab[j] for j in self.lemmas[self.offsets[corpus_id] : self.offsets[corpus_id + 1]]]

    def counts(self, corpus_ids: Sequence[int]) -> list[tuple[int, str]]:
        """:func:`adjcap.models.entities.count_tagged` of these captions: (count, lemma), sorted descending."""
        counts: Counter[str] = Counter()
        for c in corpus_ids:
            counts.update(self.of(int(c)))
        return sorted(((n, w) for w, n in counts.items()), reverse=True)

    @classmethod
    def tag(cls, texts: Sequence[str], spec: str, key: str = "") -> "CorpusNouns":
        tagger, lemmatize = ent.load_tagger(spec)
        vocab: dict[str, int] = {}
        offsets = np.zeros(len(texts) + 1, dtype=np.int64)
        out: list[int] = []
        for i, text in enumerate(texts):
            for token, tag in tagger(text):
                if tag in ent.NOUN_TAGS:  # as count_tagged: exact NN / NNS, lower + strip, lemma
                    out.append(vocab.setdefault(lemmatize(token.lower().strip()), len(vocab)))
            offsets[i + 1] = len(out)
        return cls(list(vocab), offsets, np.asarray(out, dtype=np.int32), key)

    def save(self, path: Path) -> Path:
        buf = io.BytesIO()
        np.savez(buf, vocab=np.asarray(self.vocab, dtype=str), offsets=self.offsets, lemmas=self.lemmas,
                 key=np.asarray(self.key))
        return atomic_write_bytes(path, buf.getvalue())

    @classmethod
    def load(cls, path: Path, key: str | None = None) -> "CorpusNouns | None":
        """The file's nouns, or None when it is missing, unreadable or made from something else."""
        try:
            with np.load(path, allow_pickle=False) as z:
                got = cls([str(v) for v in z["vocab"]], z["offsets"], z["lemmas"], str(z["key"]))
        except (OSError, ValueError, KeyError):
            return None
        return got if key is None or got.key == key else None


def ensure_nouns(index_dir: str | Path, texts: Sequence[str], fingerprint: str, spec: str,
                 say: Any = None, tag_missing: bool = True) -> CorpusNouns | None:
    """The corpus's nouns under tagger ``spec``: read from the index's directory, else tagged here once
    and written there (an index directory that cannot be written keeps them in memory only); with
    ``tag_missing=False`` (a GPU actor) None instead of tagging."""
    path, key = nouns_file(index_dir, fingerprint, spec)
    got = CorpusNouns.load(path, key)
    if got is not None and len(got) == len(texts):
        return got
    if not tag_missing:
        return None
    got = CorpusNouns.tag(texts, spec, key)
    try:
        got.save(path)
        if say is not None:
            say(f"entities: the nouns of {len(texts)} corpus captions tagged once, kept in {path}")
    except OSError as e:
        log.warning(f"entities: could not keep the corpus nouns in {path} ({e}); they are tagged again next time")
    return got


def nouns_for(cfg: Any, say: Any = None, tag_missing: bool = True) -> CorpusNouns | None:
    """The nouns of the corpus a run searches (``cfg`` resolved), when stage 3 counts nouns over corpus
    captions (``captioner.entities.mode=frequency``), from the index's directory (tagged there when
    missing, unless ``tag_missing`` is false: then None); None for the other entity modes."""
    if cfg.captioner.entities.mode != "frequency":
        return None
    from adjcap.index.lifecycle import encoder_identity, index_location, search_corpus

    corpus = search_corpus(cfg.retrieval, cfg.benchmark_cfg(), cfg.benchmark, cfg.paths.cache_dir)
    out = index_location(cfg.retrieval, cfg.paths.cache_dir, encoder_identity(cfg.retrieval.encoder), corpus.fingerprint)
    return ensure_nouns(out, corpus.texts, corpus.fingerprint, cfg.captioner.entities.tagger, say, tag_missing)

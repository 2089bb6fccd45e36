"""The caption index's lifecycle, owned here once: corpus -> encoder identity -> content address ->
readiness -> missing shard ranges -> encode (in this process, or by the Ray encoder pool) -> finalize
-> arrays for the retrievers.

:func:`ensure_index` is the only entry point that builds an index; how the missing shards are encoded
is the caller's ``encode_missing(plan)``: :func:`encode_shards_in_process` (notebooks, tests, the
single-process pipeline) or the Ray job's CPU tasks (:func:`tokenize_range` per shard) feeding its actor pool
(:func:`encode_ids_range` per shard).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from adjcap.config import BenchmarkCfg, ConfigError, EncoderCfg, RetrievalCfg
from adjcap.data.corpora import read_manifest
from adjcap.data.corpus import Corpus, load_corpus
from adjcap.storage.content_ids import file_content_id
from adjcap.index.shards import (
    CaptionIndexError,
    IndexManifest,
    finalize_index,
    read_arrays,
    verify_shard,
    write_shard,
)


def benchmark_corpus(bench: BenchmarkCfg, name: str) -> Corpus:
    """The retrieval corpus a (resolved) benchmark section names."""
    if not bench.corpus:
        raise ConfigError(f"benchmarks.{name}.corpus is not set: retrieval needs a caption corpus")
    return load_corpus(Path(bench.corpus), bench.corpus_format)


def search_corpus(retrieval: RetrievalCfg, bench: BenchmarkCfg, name: str, cache_dir: str | Path) -> Corpus:
    """The corpus a run searches (resolved sections): the benchmark's, or, when ``retrieval.index_dir``
    names a finished index of another corpus, that index's own corpus (its manifest records the file
    and format), checked against the manifest's fingerprint."""
    corpus = benchmark_corpus(bench, name)
    if not retrieval.index_dir:
        return corpus
    try:
        m = IndexManifest.read(Path(retrieval.index_dir))
    except CaptionIndexError:
        return corpus  # not built yet: ensure_index builds it from the benchmark's corpus
    if m.corpus_fingerprint == corpus.fingerprint:
        return corpus
    source, fmt = m.extra.get("corpus_source"), m.extra.get("corpus_format", bench.corpus_format)
    where = f"retrieval.index_dir={retrieval.index_dir}"
    if not source or not Path(source).is_file():
        raise ConfigError(f"{where} searches corpus {m.corpus_fingerprint}, not benchmarks.{name}.corpus "
                          f"({corpus.fingerprint}), and its corpus file {source or '(unrecorded)'} is not there; "
                          f"set benchmarks.{name}.corpus to the file the index was encoded from")
    other = load_corpus(Path(source), fmt)
    if other.fingerprint != m.corpus_fingerprint:
        raise ConfigError(f"{where}: its corpus file {source} changed since the index was encoded "
                          f"({other.fingerprint}, index: {m.corpus_fingerprint}); re-encode it with adjcap encode-corpus")
    return other


def index_identity(retrieval: RetrievalCfg, cache_dir: str | Path, encoder_id: str, corpus_fingerprint: str) -> str:
    """The searched index by content, not by path: encoder + corpus fingerprint + precision, as its
    manifest records them (or, before it is built, as :func:`ensure_index` will write them)."""
    try:
        m = IndexManifest.read(index_location(retrieval, cache_dir, encoder_id, corpus_fingerprint))
        return f"{m.encoder_id}|{m.corpus_fingerprint}|{m.precision}"
    except CaptionIndexError:  # the same string once built: identities do not depend on when they are asked
        return f"{encoder_id}|{corpus_fingerprint}|{retrieval.index_precision}"


def encoder_identity(enc: EncoderCfg) -> str:
    """A stable id of a (resolved) encoder section without loading it: name + tag, or name + the local
    checkpoint's content id (:func:`adjcap.storage.content_ids.file_content_id`: content, not path), + its precision
    and token budget where they are not the paper's."""
    pretrained = enc.pretrained
    if pretrained and Path(pretrained).is_file():
        ident = f"{enc.model}:file-{file_content_id(Path(pretrained))}"
    else:
        ident = f"{enc.model}:{pretrained or 'random'}"
    # what moves the vectors' bits: the precision the tower runs in and the token budget (left out at
    # the paper's fp32 and no budget, so the indexes built before these counted keep their ids)
    if enc.precision != "fp32":
        ident += f":{enc.precision}"
    if enc.text_token_budget:
        ident += f":budget-{enc.text_token_budget}"
    return ident


def index_location(retrieval: RetrievalCfg, cache_dir: str | Path, encoder_id: str, corpus_fingerprint: str) -> Path:
    """Content address of an index: encoder id + corpus fingerprint + precision (or the explicit
    ``retrieval.index_dir``)."""
    if retrieval.index_dir:
        return Path(retrieval.index_dir)
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", encoder_id)[:60]
    key = f"{encoder_id}|{corpus_fingerprint}|{retrieval.index_precision}"
    return Path(cache_dir) / "index" / f"{slug}-{corpus_fingerprint[:12]}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def index_ready(out: Path, encoder_id: str, corpus_fingerprint: str) -> bool:
    """A finished index (manifest written last) for this encoder and corpus."""
    try:
        m = IndexManifest.read(out)
    except CaptionIndexError:
        return False
    return m.encoder_id == encoder_id and m.corpus_fingerprint == corpus_fingerprint


def shard_ranges(n: int, shard_size: int) -> list[tuple[int, int, int]]:
    """(shard number, start, end) covering ``n`` captions."""
    return [(i, s, min(s + shard_size, n)) for i, s in enumerate(range(0, n, shard_size))]


@dataclass(frozen=True)
class IndexPlan:
    """What :func:`ensure_index` asks ``encode_missing`` to do: write ``todo`` shards into ``out``."""

    out: Path
    encoder_id: str
    corpus: Corpus
    precision: str
    num_shards: int
    todo: list[tuple[int, int, int]] = field(default_factory=list)


EncodeMissing = Callable[[IndexPlan], None]


def ensure_index(retrieval: RetrievalCfg, cache_dir: str | Path, corpus: Corpus, encode_missing: EncodeMissing,
                 log: Callable[[str], Any] | None = None, corpus_format: str = "ifcap") -> Path:
    """The finished index for the (resolved) retrieval section and corpus, encoding only what is
    missing (a finished shard is verified and kept; a partial one is redone)."""
    enc_id = encoder_identity(retrieval.encoder)
    out = index_location(retrieval, cache_dir, enc_id, corpus.fingerprint)
    if index_ready(out, enc_id, corpus.fingerprint):
        return out
    if retrieval.index_dir:  # the user's own index: never relabelled or re-encoded under another encoder
        try:
            m = IndexManifest.read(out)
        except CaptionIndexError:
            m = None
        if m is not None:
            raise CaptionIndexError(
                f"retrieval.index_dir={out} was encoded with {m.encoder_id} from corpus {m.corpus_fingerprint}, "
                f"but this run retrieves with {enc_id} from corpus {corpus.fingerprint}; set retrieval.encoder "
                "to the index's encoder, or drop retrieval.index_dir")
    ranges = shard_ranges(len(corpus.texts), retrieval.shard_size)
    todo = [r for r in ranges if verify_shard(out, r[0]) is None]
    if log:
        log(f"index: encoding {len(todo)}/{len(ranges)} shards of {len(corpus.texts)} captions with {enc_id} -> {out}")
    if todo:
        encode_missing(IndexPlan(out, enc_id, corpus, retrieval.index_precision, len(ranges), todo))
    still = [s for s, _, _ in todo if verify_shard(out, s) is None]
    if still:
        raise CaptionIndexError(f"{out}: shards {still[:5]} were not written by the encoder; rerun encode-corpus")
    extra: dict[str, Any] = {"corpus_source": str(corpus.source), "corpus_format": corpus_format}
    prepared = read_manifest(corpus.source)  # a corpus `adjcap prepare` laid out: where from, how sampled
    if prepared is not None:
        extra["corpus_manifest"] = prepared
    finalize_index(out, encoder_id=enc_id, corpus_fingerprint=corpus.fingerprint, num_shards=len(ranges),
                   expected_count=len(corpus.texts), extra=extra)
    return out


def tokenize_range(tokenizer, texts: Sequence[str], start: int, end: int) -> np.ndarray:
    """Corpus captions [start, end) as the encoder's token ids, int32 [n, context]: what
    :func:`encode_ids_range` encodes (the Ray job tokenises in CPU tasks, off the GPU actor's thread)."""
    ids = tokenizer(list(texts[start:end]))
    ids = ids.numpy() if isinstance(ids, torch.Tensor) else np.asarray(ids)
    if ids.size and (ids.min() < 0 or ids.max() > np.iinfo(np.int32).max):
        raise ValueError(f"token ids outside int32 ({ids.min()}..{ids.max()})")
    return ids.astype(np.int32, copy=False)


def encode_ids_range(encoder, token_ids: np.ndarray, ids: np.ndarray, shard: int, start: int, end: int, out: Path,
                     precision: str) -> None:
    """Encode the token ids of corpus captions [start, end) (:func:`tokenize_range`) and write them as shard
    ``shard`` (atomic)."""
    if token_ids.shape[0] != end - start:
        raise ValueError(f"shard {shard}: {token_ids.shape[0]} tokenised captions for the range [{start}, {end})")
    with torch.inference_mode():
        vecs = encoder.encode_tokens(torch.from_numpy(np.ascontiguousarray(token_ids)).long(), normalize=True)
    write_shard(out, shard, vecs.float().cpu().numpy().astype(np.float32), ids[start:end], precision=precision)


def encode_range(encoder, texts: Sequence[str], ids: np.ndarray, shard: int, start: int, end: int, out: Path,
                 precision: str) -> None:
    """Encode corpus captions [start, end) and write them as shard ``shard`` (atomic): tokenised here, then
    :func:`encode_ids_range`, the one encode both the in-process and the Ray path run."""
    encode_ids_range(encoder, tokenize_range(encoder.tokenizer, texts, start, end), ids, shard, start, end, out,
                     precision)


def encode_shards_in_process(encoder) -> EncodeMissing:
    """``encode_missing`` that encodes every missing shard in this process with ``encoder``."""

    def run(plan: IndexPlan) -> None:
        for shard, start, end in plan.todo:
            encode_range(encoder, plan.corpus.texts, plan.corpus.ids, shard, start, end, plan.out, plan.precision)

    return run


def index_arrays(out: Path) -> tuple[np.ndarray, np.ndarray, str]:
    """(vectors as stored, ids, precision) of a finished index, checked against its manifest
    (:func:`adjcap.index.shards.read_arrays`; the Ray job shares them as :mod:`adjcap.index.shared`)."""
    return read_arrays(out)

"""Single-process wiring of the four stages: model loading per role, the corpus index, and
:func:`run_pipeline` (records -> feature rows). Used by tests, notebooks and the Ray actors
(which load the same roles once per actor and call the same stage functions)."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from adjcap import stages
from adjcap.config import Config, ConfigError
from adjcap.data.images import decode_image
from adjcap.data.records import Record


# --------------------------------------------------------------------------------------------
# model roles
# --------------------------------------------------------------------------------------------


def load_retrieval_encoder(cfg: Config, towers: tuple[str, ...] = ("image", "text")):
    from adjcap.models.clip import load_encoder_from_config

    return load_encoder_from_config(cfg.resolved().retrieval.encoder, towers=towers, device=cfg.device)


def load_verifier_role(cfg: Config):
    if not cfg.verifier.enabled:
        return None
    from adjcap.models.blip import load_verifier_from_config

    return load_verifier_from_config(cfg.resolved().verifier, device=cfg.device)


def load_captioner_role(cfg: Config):
    """-> (IFCap captioner, its CLIP, vocabulary for the CLIP-classifier entities or None)."""
    from adjcap.models.clip import load_encoder_from_config
    from adjcap.models.ifcap import load_ifcap_from_config

    c = cfg.resolved().captioner
    captioner = load_ifcap_from_config(c, device=cfg.device)
    clip = load_encoder_from_config(c.clip, device=cfg.device)
    vocabulary = None
    if c.entities.mode == "clip_classifier":
        vocabulary = load_entity_vocabulary(cfg, clip)
    return captioner, clip, vocabulary


def load_entity_vocabulary(cfg: Config, clip) -> tuple[list[str], torch.Tensor]:
    """Vocabulary names (lower-cased, stripped, sorted, as ViECap) and their 7-template ensemble
    embeddings computed with the captioner's CLIP (spec/ifcap.md 4.3)."""
    from adjcap.entities import ensemble_embeddings

    e = cfg.captioner.entities
    if not e.vocabulary:
        raise ConfigError("captioner.entities.mode=clip_classifier needs captioner.entities.vocabulary (a JSON list)")
    path = cfg.path(e.vocabulary)
    if not path.exists():
        raise ConfigError(f"entity vocabulary {path} does not exist (captioner.entities.vocabulary)")
    data = json.loads(path.read_text())
    names = sorted({str(x).lower().strip() for x in (data.keys() if isinstance(data, dict) else data)})
    with torch.inference_mode():
        return names, ensemble_embeddings(names, lambda texts: clip.encode_texts(texts, normalize=True))


# --------------------------------------------------------------------------------------------
# corpus + index
# --------------------------------------------------------------------------------------------


def load_benchmark_corpus(cfg: Config, benchmark: str | None = None):
    from adjcap.data.corpus import load_corpus

    b = cfg.benchmark_cfg(benchmark)
    if not b.corpus:
        raise ConfigError(f"benchmarks.{benchmark or cfg.benchmark}.corpus is not set: retrieval needs a caption corpus")
    return load_corpus(cfg.path(b.corpus), b.corpus_format)


def encoder_identity(cfg: Config) -> str:
    """A stable id of the retrieval encoder without loading it: name + tag, or name + the local
    checkpoint's size and the sha256 of its first and last MiB (content, not path)."""
    e = cfg.retrieval.encoder
    pretrained = cfg.resolve(e.pretrained)
    if pretrained and Path(pretrained).is_file():
        p = Path(pretrained)
        h = hashlib.sha256()
        size = p.stat().st_size
        with open(p, "rb") as f:
            h.update(f.read(1 << 20))
            if size > (2 << 20):
                f.seek(-(1 << 20), 2)
                h.update(f.read())
        return f"{e.model}:file-{size}-{h.hexdigest()[:16]}"
    return f"{e.model}:{pretrained or 'random'}"


def index_dir_for(cfg: Config, encoder_id: str, corpus_fingerprint: str) -> Path:
    """Content address of an index: encoder id + corpus fingerprint + precision."""
    if cfg.retrieval.index_dir:
        return cfg.path(cfg.retrieval.index_dir)
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", encoder_id)[:60]
    h = hashlib.sha256(f"{encoder_id}|{corpus_fingerprint}|{cfg.retrieval.index_precision}".encode()).hexdigest()[:12]
    return cfg.cache_dir / "index" / f"{slug}-{corpus_fingerprint[:12]}-{h}"


def shard_ranges(n: int, shard_size: int) -> list[tuple[int, int, int]]:
    return [(i, s, min(s + shard_size, n)) for i, s in enumerate(range(0, n, shard_size))]


def encode_shard(encoder, texts: Sequence[str]) -> np.ndarray:
    with torch.inference_mode():
        return stages._np(encoder.encode_texts(list(texts), normalize=True)).astype(np.float32)


def ensure_index(cfg: Config, corpus, encoder=None) -> Path:
    """Build the corpus index in this process when it does not exist (resumable per shard)."""
    from adjcap import index as idx

    enc_id = encoder_identity(cfg)
    out = index_dir_for(cfg, enc_id, corpus.fingerprint)
    if index_ready(out, enc_id, corpus.fingerprint):
        return out
    if encoder is None:
        encoder = load_retrieval_encoder(cfg, towers=("text",))
    ranges = shard_ranges(len(corpus.texts), cfg.retrieval.shard_size)
    for shard_no, start, end in ranges:
        if idx.verify_shard(out, shard_no) is None:
            vecs = encode_shard(encoder, corpus.texts[start:end])
            idx.write_shard(out, shard_no, vecs, corpus.ids[start:end], precision=cfg.retrieval.index_precision)
    finalize(out, enc_id, corpus, len(ranges))
    return out


def finalize(out: Path, enc_id: str, corpus, num_shards: int) -> None:
    from adjcap import index as idx

    idx.finalize_index(out, encoder_id=enc_id, corpus_fingerprint=corpus.fingerprint, num_shards=num_shards,
                       expected_count=len(corpus.texts), extra={"corpus_source": str(corpus.source)})


def index_ready(out: Path, encoder_id: str, corpus_fingerprint: str) -> bool:
    """A finished index (manifest written last) for this encoder and corpus."""
    from adjcap import index as idx

    try:
        m = idx.IndexManifest.read(out)
    except idx.CaptionIndexError:
        return False
    return m.encoder_id == encoder_id and m.corpus_fingerprint == corpus_fingerprint


def index_arrays(out: Path) -> tuple[np.ndarray, np.ndarray, str]:
    """(vectors as stored, ids, precision) of a finished index, checked against its manifest; what
    the Ray job puts in the object store once for every retriever actor."""
    from adjcap.index import CaptionIndex

    index = CaptionIndex.load(out, device="cpu")
    vectors = index.vectors.numpy()
    if index.manifest.precision == "fp16":
        vectors = vectors.astype(np.float16)
    return vectors, index.ids.numpy(), index.manifest.precision


# --------------------------------------------------------------------------------------------
# records -> states -> rows
# --------------------------------------------------------------------------------------------


def new_states(records: Iterable[Record], benchmark: str) -> list[stages.ImageState]:
    return [stages.ImageState(image_id=r.image_id, benchmark=benchmark, split=r.split, domain=r.domain) for r in records]


def decode_into(states: list[stages.ImageState], records: Sequence[Record]) -> None:
    for s, r in zip(states, records):
        d = decode_image(r.image_path)
        if d.error:
            s.error = f"decode: {d.error}"
        else:
            s.image = d.image


@dataclass
class Models:
    retrieval: Any
    index: Any
    corpus_texts: Sequence[str]
    verifier: Any
    captioner: Any
    captioner_clip: Any
    vocabulary: Any = None


def load_models(cfg: Config, benchmark: str | None = None) -> Models:
    from adjcap.index import CaptionIndex

    corpus = load_benchmark_corpus(cfg, benchmark)
    retrieval = load_retrieval_encoder(cfg)
    enc_id = encoder_identity(cfg)
    index = CaptionIndex.load(ensure_index(cfg, corpus, retrieval), device=cfg.device,
                              encoder_id=enc_id, corpus_fingerprint=corpus.fingerprint)
    captioner, clip, vocabulary = load_captioner_role(cfg)
    return Models(retrieval, index, corpus.texts, load_verifier_role(cfg), captioner, clip, vocabulary)


def process_states(states: list[stages.ImageState], models: Models, cfg: Config) -> list[stages.ImageState]:
    stages.retrieve(states, models.retrieval, models.index, models.corpus_texts, cfg.retrieval.top_l)
    stages.verify(states, models.verifier, cfg.verifier.keep)
    stages.caption(states, models.captioner, models.captioner_clip, cfg, models.vocabulary)
    stages.score(states, models.retrieval, models.verifier)
    return states


def run_pipeline(records: Sequence[Record], cfg: Config, models: Models | None = None,
                 benchmark: str | None = None, batch_size: int | None = None) -> list[dict[str, Any]]:
    """Records -> feature rows (DESIGN.md section 2), one per record, in record order."""
    benchmark = benchmark or cfg.benchmark
    models = models or load_models(cfg, benchmark)
    bs = batch_size or cfg.ray.batch_size
    rows: list[dict[str, Any]] = []
    for start in range(0, len(records), bs):
        chunk = list(records[start : start + bs])
        states = new_states(chunk, benchmark)
        decode_into(states, chunk)
        process_states(states, models, cfg)
        rows.extend(s.to_row() for s in states)
    return rows

"""The caption corpora retrieval can search instead of a benchmark's own: a registry (``corpora.toml``
beside this file: name, source, reader, prepared file, licence line; ``retrieval.corpus = NAME``), the
readers of their published files, the seeded sample ``--max-captions`` takes, and the overlap of a
corpus with a benchmark's references (exact-match captions: retrieval-corpus exposure).

A prepared corpus is one caption a line (``captions``), with a manifest beside it
(``captions.manifest.json``: the corpus, its source files and their sha256, the sampling seed and size) that
the caption index records (:func:`adjcap.index.lifecycle.ensure_index`)."""

from __future__ import annotations

import functools
import json
import random
import tomllib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from adjcap.data.records import DataError
from adjcap.registry import lookup

SAMPLE_SEED = 0  # --max-captions: the seed of the sample (recorded in the manifest)


@dataclass(frozen=True)
class CorpusEntry:
    name: str
    title: str
    source: str  # the `adjcap prepare` step that lays it out, or "demo"
    reader: str  # a key of READERS
    captions: str  # the prepared file (one caption a line), with {data} / {cache}
    licence: str

    def path(self, data_dir: str | Path, cache_dir: str | Path) -> Path:
        return Path(self.captions.replace("{data}", str(data_dir)).replace("{cache}", str(cache_dir))).expanduser()


@functools.lru_cache(maxsize=1)
def corpora() -> dict[str, CorpusEntry]:
    """The registry: name -> entry, in the order of ``corpora.toml``."""
    data = tomllib.loads((resources.files("adjcap.data") / "corpora.toml").read_text(encoding="utf-8"))
    out = {}
    for name, d in data.items():
        out[name] = CorpusEntry(name=name, title=str(d["title"]), source=str(d["source"]), reader=str(d["reader"]),
                                captions=str(d["captions"]), licence=str(d["licence"]))
        if out[name].reader not in READERS:
            raise DataError(f"corpora.toml [{name}]: reader '{out[name].reader}' is not one of {', '.join(READERS)}")
    return out


def get_corpus(name: str) -> CorpusEntry:
    return lookup(corpora(), name, "corpus", DataError, see="adjcap/data/corpora.toml")


def corpus_of_step(step: str) -> CorpusEntry | None:
    """The corpus the prepare step ``step`` lays out, or None."""
    return next((c for c in corpora().values() if c.source == step), None)


# ---- readers of the published files ------------------------------------------------------------


def _tsv_caption_url(path: Path) -> Iterator[str]:
    """Conceptual Captions' ``Train_GCC-training.tsv``: ``caption<TAB>url`` per line, no header."""
    with open(path, encoding="utf-8", newline="\n") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line:
                continue
            caption, tab, url = line.partition("\t")
            if not tab or not url.startswith(("http://", "https://")):
                raise DataError(f"{path}: line {n} is not 'caption<TAB>url' (Conceptual Captions' TSV layout)")
            yield caption


def _parquet_top_caption(path: Path) -> Iterator[str]:
    """A LAION-COCO parquet shard: its ``top_caption`` column (the best-ranked BLIP caption per image)."""
    import pyarrow.parquet as pq

    try:
        f = pq.ParquetFile(path)
    except Exception as e:  # noqa: BLE001 - pyarrow raises several kinds for a file that is not parquet
        raise DataError(f"{path}: not a parquet file ({type(e).__name__}: {e})") from None
    if "top_caption" not in f.schema_arrow.names:
        raise DataError(f"{path}: no 'top_caption' column (has {', '.join(f.schema_arrow.names)}); "
                        "is it a LAION-COCO shard?")
    for batch in f.iter_batches(columns=["top_caption"], batch_size=65536):
        for c in batch.column(0).to_pylist():
            if isinstance(c, str):
                yield c


def _lines(path: Path) -> Iterator[str]:
    yield from path.read_text(encoding="utf-8").splitlines()


READERS: dict[str, Callable[[Path], Iterator[str]]] = {
    "tsv-caption-url": _tsv_caption_url,
    "parquet-top-caption": _parquet_top_caption,
    "lines": _lines,
}


def read_published(entry: CorpusEntry, files: Sequence[Path]) -> list[str]:
    """Every caption of the published ``files``, in file order; newlines inside a caption become spaces
    (the prepared file is one caption a line)."""
    return [" ".join(c.split()) for f in files for c in READERS[entry.reader](Path(f)) if c.strip()]


def sample(captions: Sequence[str], max_captions: int | None, seed: int = SAMPLE_SEED) -> list[str]:
    """``max_captions`` of ``captions`` drawn without replacement by ``random.Random(seed)``, kept in
    their file order; all of them when ``max_captions`` is None or not smaller."""
    if max_captions is None or max_captions >= len(captions):
        return list(captions)
    keep = sorted(random.Random(seed).sample(range(len(captions)), int(max_captions)))
    return [captions[i] for i in keep]


def manifest_path(captions: Path) -> Path:
    return captions.with_suffix(".manifest.json")


def read_manifest(captions: str | Path) -> dict[str, Any] | None:
    """The prepared corpus's manifest beside ``captions``, or None (a corpus not laid out by prepare)."""
    p = manifest_path(Path(captions))
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and "corpus" in doc else None


# ---- exposure: the corpus against a benchmark's references ------------------------------------


def match_key(caption: str) -> str:
    """What "the same caption" means for the overlap: lower case, whitespace collapsed, without a final period."""
    return " ".join(caption.lower().split()).rstrip(".").rstrip()


def reference_overlap(corpus_texts: Iterable[str], references: Mapping[str, Sequence[str]]) -> dict[str, Any]:
    """How many reference captions appear verbatim (:func:`match_key`) in the corpus, and how many
    images have at least one reference that does."""
    keys = {match_key(t) for t in corpus_texts}
    refs = [r for rs in references.values() for r in rs]
    hits = sum(1 for r in refs if match_key(r) in keys)
    images = sum(1 for rs in references.values() if any(match_key(r) in keys for r in rs))
    return {"references": len(refs), "in_corpus": hits,
            "percent": round(100.0 * hits / len(refs), 3) if refs else None,
            "images": len(references), "images_with_one": images}


def exposure(corpus: Any, name: str, references_by_split: Mapping[str, Mapping[str, Sequence[str]]]) -> dict[str, Any]:
    """What a run's retrieval searched (``corpus``: an :class:`adjcap.data.corpus.Corpus`; ``name``: the
    registered corpus, or the benchmark's own) and, per split, how many references it holds verbatim."""
    out: dict[str, Any] = {"name": name, "source": str(corpus.source), "captions": len(corpus.texts),
                           "fingerprint": corpus.fingerprint}
    manifest = read_manifest(corpus.source)
    if manifest is not None:
        out["sample"] = manifest.get("sample")
        out["source_captions"] = manifest.get("source_captions")
    out["overlap"] = {split: reference_overlap(corpus.texts, refs) for split, refs in references_by_split.items()
                      if any(refs.values())}
    return out

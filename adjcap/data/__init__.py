"""Benchmark readers, the retrieval caption corpus and image decoding."""

from adjcap.data.benchmarks import (
    FORMATS,
    NOCAPS_DOMAINS,
    References,
    coco_id_from_name,
    detect_format,
    normalize_domain,
    read_benchmark,
    read_references,
)
from adjcap.data.corpus import Corpus, corpus_fingerprint, load_corpus, normalize_caption
from adjcap.data.images import DecodedImage, decode_image, decode_images
from adjcap.data.records import DataError, Record

__all__ = [
    "FORMATS",
    "NOCAPS_DOMAINS",
    "Corpus",
    "DataError",
    "DecodedImage",
    "Record",
    "References",
    "coco_id_from_name",
    "corpus_fingerprint",
    "decode_image",
    "decode_images",
    "detect_format",
    "load_corpus",
    "normalize_caption",
    "normalize_domain",
    "read_benchmark",
    "read_references",
]

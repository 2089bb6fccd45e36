"""Benchmark readers (a registry of annotation layouts), references, the retrieval caption corpus,
image paths and image decoding."""

from adjcap.data.annotations import detect_format
from adjcap.data.benchmarks import read_benchmark, split_annotations
from adjcap.data.corpus import Corpus, corpus_fingerprint, load_corpus, normalize_caption
from adjcap.data.domains import NOCAPS_DOMAINS, normalize_domain
from adjcap.data.ids import coco_id_from_name
from adjcap.data.images import DecodedImage, decode_image, decode_images
from adjcap.data.layouts import format_names, register_layout
from adjcap.data.records import DataError, Record
from adjcap.data.references import References, read_references

__all__ = [
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
    "format_names",
    "load_corpus",
    "normalize_caption",
    "normalize_domain",
    "read_benchmark",
    "read_references",
    "register_layout",
    "split_annotations",
]

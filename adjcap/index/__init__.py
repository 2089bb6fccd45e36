"""The caption-embedding index: sharded storage on disk (:mod:`adjcap.index.shards`), exact top-k search
(:mod:`adjcap.index.search`),
shared once per node by the Ray job's retriever actors (:mod:`adjcap.index.shared`)
and its one lifecycle owner, corpus to finished index (:mod:`adjcap.index.lifecycle`)."""

from adjcap.index.lifecycle import (
    IndexPlan,
    benchmark_corpus,
    encode_ids_range,
    encode_range,
    encode_shards_in_process,
    encoder_identity,
    ensure_index,
    index_arrays,
    index_location,
    index_ready,
    shard_ranges,
    tokenize_range,
)
from adjcap.index.search import CaptionIndex, brute_force_topk
from adjcap.index.shards import (
    FORMAT_VERSION,
    MANIFEST,
    CaptionIndexError,
    IndexManifest,
    ShardInfo,
    build_index,
    check_shard,
    finalize_index,
    read_arrays,
    shard_files,
    unit_rows,
    verify_shard,
    write_shard,
)
from adjcap.index.shared import SharedIndex, TextTable, shared_index

__all__ = [
    "FORMAT_VERSION", "MANIFEST", "CaptionIndex", "CaptionIndexError", "IndexManifest", "IndexPlan", "ShardInfo",
    "SharedIndex", "TextTable", "read_arrays", "shared_index",
    "benchmark_corpus", "brute_force_topk", "build_index", "check_shard", "encode_ids_range", "encode_range",
    "encode_shards_in_process",
    "encoder_identity", "ensure_index", "finalize_index", "index_arrays", "index_location", "index_ready",
    "shard_files", "shard_ranges", "tokenize_range", "unit_rows", "verify_shard", "write_shard",
]

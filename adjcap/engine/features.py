"""Arrow schemas of the feature table (one row per image) and of predictions.

The feature row is the contract between the frozen stages (``adjcap.engine.stages``), the Ray job that
writes Parquet parts, the rerankers (``adjcap.rerank``) and the evaluation. See docs/architecture.md,
"Data flow of one image".
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

RETRIEVED = pa.struct(
    [
        ("corpus_id", pa.int64()),
        ("text", pa.string()),
        ("cosine", pa.float32()),
        ("verifier", pa.float32()),  # ITM match probability of every retrieved caption; NaN without a verifier
    ]
)

VERIFIED = pa.struct(
    [
        ("corpus_id", pa.int64()),
        ("text", pa.string()),
        ("verifier", pa.float32()),  # ITM match probability in (0, 1); NaN when no verifier is used
        ("retrieval_rank", pa.int32()),  # 0-based rank among the L retrieved
    ]
)

CANDIDATE = pa.struct(
    [
        ("text", pa.string()),
        ("lm_logprob_sum", pa.float32()),
        ("lm_logprob_mean", pa.float32()),
        ("n_tokens", pa.int32()),
        ("beam_rank", pa.int32()),  # 0 = the LM's (beam search's) own first choice
        ("retrieval_cosine", pa.float32()),  # output scorer (scorer.encoder) cosine with the image
        ("verifier", pa.float32()),
        ("clipscore_cosine", pa.float32()),  # CLIPScore encoder (eval.clipscore) cosine with the image
    ]
)

FEATURE_SCHEMA = pa.schema(
    [
        ("image_id", pa.string()),
        ("benchmark", pa.string()),
        ("split", pa.string()),
        ("domain", pa.string()),  # NoCaps in/near/out; null elsewhere
        ("error", pa.string()),  # null when ok
        ("retrieved", pa.list_(RETRIEVED)),
        ("verified", pa.list_(VERIFIED)),
        ("entities", pa.list_(pa.string())),
        ("prompt", pa.string()),
        ("candidates", pa.list_(CANDIDATE)),
        ("verifier_backend", pa.string()),  # "transformers", "lavis" or "open_clip"; null without a verifier
    ]
)

FEATURE_COLUMNS = FEATURE_SCHEMA.names


def empty_row(image_id: str, benchmark: str, split: str, domain: str | None, error: str | None) -> dict[str, Any]:
    """A feature row with no stage outputs (used for images that failed)."""
    return {
        "image_id": str(image_id),
        "benchmark": benchmark,
        "split": split,
        "domain": domain,
        "error": error,
        "retrieved": [],
        "verified": [],
        "entities": [],
        "prompt": None,
        "candidates": [],
        "verifier_backend": None,
    }


def rows_to_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Feature rows (dicts) -> an Arrow table with exactly FEATURE_SCHEMA."""
    return pa.Table.from_pylist(rows, schema=FEATURE_SCHEMA)


PREDICTION_SCHEMA = pa.schema(
    [
        ("image_id", pa.string()),
        ("caption", pa.string()),
        ("picker", pa.string()),
        ("candidate_index", pa.int32()),
    ]
)

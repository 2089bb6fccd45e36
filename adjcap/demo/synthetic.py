"""Synthetic feature rows (FEATURE_SCHEMA) for the reranker's tests and benchmark.

These are random numbers, not a stage: nothing in the pipeline reads them. They exercise the exact
row layout that ``adjcap.engine.stages`` writes so that the tests and ``benchmarks/rerank.py`` go through the
same Arrow -> :func:`adjcap.rerank.features.load_features` path as real feature tables.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_WORDS = "a man woman dog cat sits stands on the with table street near red blue two of in".split()


def synthetic_feature_rows(
    n_images: int,
    n_candidates: int = 20,
    seed: int = 0,
    signal: str | None = None,
    split: str = "val",
    n_verified: int = 5,
    short_every: int = 0,
    error_every: int = 0,
) -> list[dict[str, Any]]:
    """Random feature rows.

    ``signal=None``: the three scorers are partly correlated random values. ``signal`` in
    {"lm", "retrieval", "verifier"}: only that scorer varies within an image; the other two are
    constant per image, so the Borda consensus is decided by that scorer alone.
    ``short_every=k``: every k-th image has a beam shorter than ``n_candidates``;
    ``error_every=k``: every k-th image is an error row."""
    if signal not in (None, "lm", "retrieval", "verifier"):
        raise ValueError(f"signal must be None, 'lm', 'retrieval' or 'verifier', got {signal!r}")
    rng = np.random.default_rng(seed)
    rows: list[dict[str, Any]] = []
    for i in range(n_images):
        iid = f"{split}-{seed}-{i:06d}"
        base = {
            "image_id": iid,
            "benchmark": "synthetic",
            "split": split,
            "domain": None,
            "retrieved": [],
            "entities": [],
            "prompt": "There are a, b in image.",
        }
        if error_every and i % error_every == error_every - 1:
            rows.append({**base, "error": "synthetic failure", "verified": [], "candidates": []})
            continue
        n = n_candidates
        if short_every and i % short_every == short_every - 1:
            n = int(rng.integers(2, max(3, n_candidates)))
        latent = rng.normal(size=n)
        lm_mean = -2.0 + 0.3 * (0.5 * latent + rng.normal(size=n))
        cos = 0.30 + 0.03 * (0.5 * latent + rng.normal(size=n))
        ver = 1.0 / (1.0 + np.exp(-(0.5 * latent + rng.normal(size=n))))
        if signal is not None:
            c_lm, c_cos, c_ver = -2.0 + 0.1 * rng.normal(), 0.3 + 0.01 * rng.normal(), float(rng.uniform())
            if signal != "lm":
                lm_mean = np.full(n, c_lm)
            if signal != "retrieval":
                cos = np.full(n, c_cos)
            if signal != "verifier":
                ver = np.full(n, c_ver)
        n_tok = rng.integers(6, 16, size=n)
        order = np.argsort(-lm_mean, kind="stable")
        beam_rank = np.empty(n, dtype=np.int64)
        beam_rank[order] = np.arange(n)
        cands = []
        for j in range(n):
            words = rng.choice(_WORDS, size=int(n_tok[j]) - 1)
            cands.append(
                {
                    "text": f"c{j} " + " ".join(words),
                    "lm_logprob_sum": float(lm_mean[j] * n_tok[j]),
                    "lm_logprob_mean": float(lm_mean[j]),
                    "n_tokens": int(n_tok[j]),
                    "beam_rank": int(beam_rank[j]),
                    "retrieval_cosine": float(cos[j]),
                    "verifier": float(ver[j]),
                }
            )
        ranks = rng.permutation(9)[:n_verified]
        verified = [
            {
                "corpus_id": int(rng.integers(0, 10_000)),
                "text": " ".join(rng.choice(_WORDS, size=int(rng.integers(5, 14)))),
                "verifier": float(rng.uniform()),
                "retrieval_rank": int(r),
            }
            for r in ranks
        ]
        verified.sort(key=lambda v: -v["verifier"])
        rows.append({**base, "error": None, "verified": verified, "candidates": cands})
    return rows

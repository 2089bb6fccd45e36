"""The corpus encode's two halves (the Ray job tokenises in CPU tasks, the encoder pool encodes the ids):
the tokenizer loaded without weights gives the encoder's own ids, and encoding those ids writes the shard
the one-process encode writes, bit for bit."""

import numpy as np
import pytest
import torch

from adjcap.index import benchmark_corpus, encode_ids_range, encode_range, tokenize_range
from adjcap.models.clip import tokenizer_for
from adjcap.models.roles import load_retrieval_encoder


def test_tokens_made_apart_encode_to_the_same_shard(demo_cfg, tmp_path):
    cfg = demo_cfg.resolved()
    corpus = benchmark_corpus(cfg.benchmark_cfg(), "demo")
    texts, ids = list(corpus.texts[:300]), np.asarray(corpus.ids[:300])
    enc = load_retrieval_encoder(cfg.retrieval.encoder, "cpu", towers=("text",))
    tokens = tokenize_range(tokenizer_for(cfg.retrieval.encoder), texts, 40, 300)
    assert tokens.dtype == np.int32 and torch.equal(torch.from_numpy(tokens).long(), enc.tokenize(texts[40:300]).ids)
    apart, together = tmp_path / "apart", tmp_path / "together"
    for out in (apart, together):
        out.mkdir()
    encode_ids_range(enc, tokens, ids, 0, 40, 300, apart, "fp32")
    encode_range(enc, texts, ids, 0, 40, 300, together, "fp32")
    assert (apart / "shard-00000.npy").read_bytes() == (together / "shard-00000.npy").read_bytes()
    with pytest.raises(ValueError, match=r"shard 3: 10 tokenised captions for the range \[0, 12\)"):
        encode_ids_range(enc, tokens[:10], ids, 3, 0, 12, apart, "fp32")


def test_ids_outside_int32_are_refused():
    with pytest.raises(ValueError, match="outside int32"):
        tokenize_range(lambda t: torch.full((len(t), 4), 2**40), ["a", "b"], 0, 2)

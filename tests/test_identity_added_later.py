"""Settings added after runs existed stay out of identities at their old behaviour's value
(adjcap.engine.identity.ADDED_LATER), and enter them at any other value; the corpus index is keyed by the
precision and token budget its vectors were encoded with."""

from __future__ import annotations

from adjcap.config import load_config
from adjcap.engine.identity import ADDED_LATER, config_identity, neutral, stage_identities
from adjcap.index.lifecycle import encoder_identity, index_location

BASE = ["paths.cache_dir=/nonexistent/cache", "paths.data_dir=/nonexistent/data"]


def test_a_later_setting_at_its_old_value_is_left_out_and_counts_otherwise():
    cfg = load_config("headline", BASE).resolved()
    keys = {k for d in config_identity(cfg).values() for k in d}
    assert not any(neutral(k, None) or k == "tf32" or k.endswith("text_token_budget") for k in keys)
    assert set(ADDED_LATER) >= {"tf32", "*.text_token_budget"}
    base = stage_identities(cfg, "corpus-fp")
    for change, first in (("tf32=true", "retrieve"), ("verifier.text_token_budget=512", "verify"),
                          ("verifier.attention=sdpa", "verify"), ("scorer.encoder.text_token_budget=1024", "score"),
                          ("verifier.long_captions=sentence_min", "score")):
        other = stage_identities(load_config("headline", [*BASE, change]).resolved(), "corpus-fp")
        moved = [s for s in base if base[s] != other[s]]
        assert moved and moved[0] == first, (change, moved)


def test_the_index_is_keyed_by_the_precision_and_budget_of_its_vectors():
    enc = load_config("headline", BASE).resolved().retrieval.encoder
    ids = {encoder_identity(enc), encoder_identity(enc.model_copy(update={"precision": "bf16"})),
           encoder_identity(enc.model_copy(update={"text_token_budget": 2048}))}
    assert len(ids) == 3
    assert encoder_identity(enc) == f"{enc.model}:{enc.pretrained}"  # the indexes built before keep their place
    retrieval = load_config("headline", BASE).resolved().retrieval
    places = {index_location(retrieval, "/c", i, "fp") for i in ids}
    assert len(places) == 3

"""The single-process pipeline on the demo world with tiny models loaded through the real loaders."""

import dataclasses
import math

import numpy as np
import pyarrow as pa
import pytest

from adjcap.data.records import Record
from adjcap.features import FEATURE_SCHEMA, rows_to_table
from adjcap.pipeline import load_models, run_pipeline
from adjcap.run_plan import read_records


@pytest.fixture(scope="module")
def models(demo_cfg):
    return load_models(demo_cfg)


@pytest.fixture(scope="module")
def test_records(demo_cfg):
    return read_records(demo_cfg.resolved())["test"][:6]


def test_rows_follow_the_method(demo_cfg, models, test_records):
    rows = run_pipeline(test_records, demo_cfg, models)
    assert [r["image_id"] for r in rows] == [r.image_id for r in test_records]
    table = rows_to_table(rows)
    assert table.schema.equals(FEATURE_SCHEMA)
    for row in rows:
        assert row["error"] is None, row["error"]
        # stage 1: L retrieved, cosine descending
        cos = [r["cosine"] for r in row["retrieved"]]
        assert len(cos) == demo_cfg.retrieval.top_l and cos == sorted(cos, reverse=True)
        # stage 2: the k kept are the k best verifier scores among the L, in descending order
        ver = [v["verifier"] for v in row["verified"]]
        assert len(ver) == demo_cfg.verifier.keep and ver == sorted(ver, reverse=True)
        assert all(0.0 < v < 1.0 for v in ver)
        kept = {v["retrieval_rank"] for v in row["verified"]}
        assert len(kept) == demo_cfg.verifier.keep
        # every retrieved caption carries its verifier score; the kept ones are its top k
        all_ver = [r["verifier"] for r in row["retrieved"]]
        assert sorted(all_ver, reverse=True)[: len(ver)] == ver
        assert all(row["retrieved"][v["retrieval_rank"]]["verifier"] == v["verifier"] for v in row["verified"])
        # stage 3: a beam of N, ranked by mean log-prob, beam_rank 0..N-1
        cands = row["candidates"]
        assert len(cands) == demo_cfg.captioner.beam_width
        means = [c["lm_logprob_mean"] for c in cands]
        assert means == sorted(means, reverse=True)
        assert [c["beam_rank"] for c in cands] == list(range(len(cands)))
        for c in cands:
            assert math.isclose(c["lm_logprob_sum"] / c["n_tokens"], c["lm_logprob_mean"], rel_tol=1e-4)
            # stage 4: scored by both frozen scorers
            assert -1.0 <= c["retrieval_cosine"] <= 1.0
            assert 0.0 < c["verifier"] < 1.0
        assert row["prompt"].startswith("There are") and row["prompt"].endswith(" in image.")


def test_stage4_reuses_the_stage1_embedding(demo_cfg, models, test_records):
    """The candidate cosine equals an independent encode of image and text with the same encoder."""
    from adjcap.data.images import decode_image

    rows = run_pipeline(test_records[:2], demo_cfg, models)
    for rec, row in zip(test_records[:2], rows):
        img = decode_image(rec.image_path).image
        ie = models.retrieval.encode_images([img], normalize=True)[0].float().numpy()
        texts = [c["text"] for c in row["candidates"][:3]]
        te = models.retrieval.encode_texts(texts, normalize=True).float().numpy()
        np.testing.assert_allclose(te @ ie, [c["retrieval_cosine"] for c in row["candidates"][:3]], atol=1e-4)


def test_output_scorer_and_clipscore_encoders_are_their_own(demo_cfg, models, test_records):
    """scorer.encoder and eval.clipscore: on the demo preset both are the retrieval CLIP, so the CLIPScore
    cosine is the output cosine; with the captioner's CLIP as the output scorer, s_R is that encoder's
    own cosine (image encoded again, not stage 1's embedding) while the CLIPScore cosine stays the
    fixed encoder's."""
    from adjcap.data.images import decode_image
    from adjcap.models import roles

    recs = test_records[:2]
    rows = run_pipeline(recs, demo_cfg, models)
    assert models.scorer.reuse_stage1 and models.scorer.clipscore is None
    for row in rows:
        assert [c["clipscore_cosine"] for c in row["candidates"]] == [c["retrieval_cosine"] for c in row["candidates"]]

    cfg = demo_cfg.model_copy(deep=True)
    cfg.scorer.encoder = cfg.captioner.clip.model_copy()
    rcfg = cfg.resolved()
    scorer = roles.load_scorer(rcfg.retrieval.encoder, rcfg.scorer_encoder(), rcfg.eval.clipscore, rcfg.verifier,
                               "cpu", loaded={"retrieval": models.retrieval, "verifier": models.verifier})
    assert not scorer.reuse_stage1 and scorer.clipscore is models.retrieval
    assert scorer.output is not models.retrieval  # loaded on its own (the demo's two tiny CLIPs share weights)
    m = type(models)(**{**models.__dict__, "scorer": scorer})
    swapped = run_pipeline(recs, cfg, m)
    for rec, row, old in zip(recs, swapped, rows):
        img = decode_image(rec.image_path).image
        texts = [c["text"] for c in row["candidates"][:3]]
        for enc, key in ((scorer.output, "retrieval_cosine"), (models.retrieval, "clipscore_cosine")):
            ie = enc.encode_images([img], normalize=True)[0].float().numpy()
            te = enc.encode_texts(texts, normalize=True).float().numpy()
            np.testing.assert_allclose(te @ ie, [c[key] for c in row["candidates"][:3]], atol=1e-4)
        assert [c["text"] for c in row["candidates"]] == [c["text"] for c in old["candidates"]]
        np.testing.assert_allclose([c["clipscore_cosine"] for c in row["candidates"]],
                                   [c["clipscore_cosine"] for c in old["candidates"]], atol=1e-5)


def test_captioner_batch_size_reaches_the_beam_search(demo_cfg, models, test_records):
    """captioner.batch_size is the fast beam's chunk size (images decoded together)."""
    from adjcap.models.roles import CaptionerRole

    real = models.captioner.captioner
    seen = []

    class Recording:  # the real captioner, with the batch size it is asked for noted
        def __getattr__(self, name):
            return getattr(real, name)

        def generate(self, *args, **kwargs):
            seen.append((len(args[0]), kwargs.get("batch_size")))
            return real.generate(*args, **kwargs)

    cfg = demo_cfg.model_copy(deep=True)
    cfg.captioner.batch_size = 2
    role = CaptionerRole(Recording(), models.captioner.clip, models.captioner.vocabulary)
    rows = run_pipeline(test_records[:3], cfg, type(models)(**{**models.__dict__, "captioner": role}), batch_size=3)
    assert seen == [(3, 2)]
    whole = run_pipeline(test_records[:3], demo_cfg, models, batch_size=3)
    assert [[c["text"] for c in r["candidates"]] for r in rows] == [[c["text"] for c in r["candidates"]] for r in whole]


def test_bad_image_becomes_an_error_row_and_others_survive(demo_cfg, models, test_records, tmp_path):
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    recs = [test_records[0],
            Record(image_id="missing.png", image_path=str(tmp_path / "missing.png"), references=("x",), split="test"),
            Record(image_id="broken.jpg", image_path=str(broken), references=("x",), split="test"),
            test_records[1]]
    rows = run_pipeline(recs, demo_cfg, models)
    assert [r["image_id"] for r in rows] == [r.image_id for r in recs]
    assert rows[0]["error"] is None and rows[3]["error"] is None
    assert rows[1]["error"] and "decode" in rows[1]["error"]
    assert rows[2]["error"] and "decode" in rows[2]["error"]
    assert rows[1]["candidates"] == [] and len(rows[0]["candidates"]) == demo_cfg.captioner.beam_width
    rows_to_table(rows)  # error rows still fit the schema


def test_without_verifier_keeps_retrieval_order(demo_cfg, models, test_records):
    cfg = demo_cfg.model_copy(deep=True)
    cfg.verifier.enabled = False
    m = type(models)(**{**models.__dict__, "verifier": None,
                        "scorer": dataclasses.replace(models.scorer, verifier=None)})
    rows = run_pipeline(test_records[:2], cfg, m)
    for row in rows:
        assert [v["retrieval_rank"] for v in row["verified"]] == list(range(cfg.verifier.keep))
        assert all(math.isnan(c["verifier"]) for c in row["candidates"])
        pa.Table.from_pylist([row], schema=FEATURE_SCHEMA)


def test_contrastive_decoding_option_changes_the_beam_scores(demo_cfg, models, test_records):
    """The negative-result option: l_cd = (1+lambda) l_pos - lambda l_neg with the
    verifier's bottom-4 retrieved captions as the negative prompt."""
    cfg = demo_cfg.model_copy(deep=True)
    base = run_pipeline(test_records[:2], cfg, models)
    cfg.captioner.contrastive_lambda = 0.3
    cd = run_pipeline(test_records[:2], cfg, models)
    for b, c in zip(base, cd):
        assert c["error"] is None and len(c["candidates"]) == cfg.captioner.beam_width
        assert [x["lm_logprob_sum"] for x in b["candidates"]] != [x["lm_logprob_sum"] for x in c["candidates"]]


def test_clip_classifier_entities_path(demo_cfg, models, test_records):
    """NoCaps' entity path: top-3 vocabulary entries by CLIP with the 7-template ensemble, p >= threshold."""
    from adjcap.models.roles import CaptionerRole, entity_vocabulary

    cfg = demo_cfg.model_copy(deep=True)
    cfg.captioner.entities.mode = "clip_classifier"
    cfg.captioner.entities.classifier_threshold = 0.0
    names, emb = entity_vocabulary(cfg.resolved().captioner, models.captioner.clip)
    assert names == sorted(names) and emb.shape[0] == len(names)
    role = CaptionerRole(models.captioner.captioner, models.captioner.clip, (names, emb))
    m = type(models)(**{**models.__dict__, "captioner": role})
    rows = run_pipeline(test_records[:2], cfg, m)
    for row in rows:
        assert row["error"] is None
        assert len(row["entities"]) == cfg.captioner.entities.classifier_top_k
        assert set(row["entities"]) <= set(names)

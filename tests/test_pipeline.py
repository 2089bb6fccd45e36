"""The single-process pipeline on the demo world with tiny models loaded through the real loaders."""

import dataclasses
import math

import numpy as np
import pyarrow as pa
import pytest

from adjcap.data.records import Record
from adjcap.engine.features import FEATURE_SCHEMA, rows_to_table
from adjcap.engine.pipeline import load_models, run_pipeline
from adjcap.engine.run_plan import read_records


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
    """captioner.batch_size (image slots) and captioner.rows (beam rows) reach the fast beam search."""
    from adjcap.models.roles import CaptionerRole

    real = models.captioner.captioner
    seen = []

    class Recording:  # the real captioner, with the batch size it is asked for noted
        def __getattr__(self, name):
            return getattr(real, name)

        def generate(self, *args, **kwargs):
            seen.append((len(args[0]), kwargs.get("batch_size"), kwargs.get("rows")))
            return real.generate(*args, **kwargs)

    cfg = demo_cfg.model_copy(deep=True)
    cfg.captioner.batch_size = 2
    cfg.captioner.rows = 2 * cfg.captioner.beam_width
    role = CaptionerRole(Recording(), models.captioner.clip, models.captioner.vocabulary)
    rows = run_pipeline(test_records[:3], cfg, type(models)(**{**models.__dict__, "captioner": role}), batch_size=3)
    assert seen == [(3, 2, 2 * cfg.captioner.beam_width)]
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


# ---- GPU failures (issue 38 item 6), simulated on the CPU through the real stages ----------------


class _FailsAbove:
    """A real model whose ``method`` raises ``error`` for a call on more than ``limit`` images (what a GPU
    out of memory, or a broken device, does to a stage's batch); every call it lets through is the model's."""

    def __init__(self, model, method: str, limit: int, error: BaseException):
        self.model, self.method, self.limit, self.error, self.sizes = model, method, limit, error, []

    def __getattr__(self, name):
        attr = getattr(self.model, name)
        if name != self.method:
            return attr

        def call(images, *args, **kwargs):
            n = len(images)
            self.sizes.append(n)
            if n > self.limit:
                raise self.error
            return attr(images, *args, **kwargs)

        return call


def _with(models, **swap):
    from adjcap.engine.pipeline import Models

    return Models(**{**vars(models), **swap})


def test_out_of_gpu_memory_halves_the_batch_and_carries_the_size_on(demo_cfg, models, test_records, monkeypatch, caplog):
    """A batch out of memory is retried in halves; the halved size carries to the next batches of the
    run (they start at it instead of failing once more at full size), logged once."""
    import logging

    import torch

    monkeypatch.delenv("ADJCAP_NUMERICS", raising=False)  # whole batches (portable numerics: one image each)
    recs = test_records[:6]  # two batches: 4 images, then 2
    plain = run_pipeline(recs, demo_cfg, models, batch_size=4)
    enc = _FailsAbove(models.retrieval, "encode_images", 1, torch.cuda.OutOfMemoryError("CUDA out of memory."))
    with caplog.at_level(logging.WARNING, logger="adjcap.engine.stages"):
        rows = run_pipeline(recs, demo_cfg, _with(models, retrieval=enc), batch_size=4)
    # 4 and 2 did not fit; halved to 1 for the rest of the batch, and the next batch starts at 1 (not at 2)
    assert enc.sizes == [4, 2, 1, 1, 1, 1, 1, 1]
    said = [r.getMessage() for r in caplog.records if "ran out of GPU memory" in r.getMessage()]
    assert said == ["stage retrieve ran out of GPU memory: its next batches in this process start at 2 image(s)",
                    "stage retrieve ran out of GPU memory: its next batches in this process start at 1 image(s)"]
    assert all(r["error"] is None for r in rows)
    assert [[x["corpus_id"] for x in r["retrieved"]] for r in rows] == \
        [[x["corpus_id"] for x in r["retrieved"]] for r in plain]
    assert [[c["text"] for c in r["candidates"]] for r in rows] == [[c["text"] for c in r["candidates"]] for r in plain]


@pytest.mark.slow  # ~15 s of graph capture: make test runs it, make test-fast does not
def test_captioner_compile_gives_the_same_beams_and_off_touches_nothing(demo_cfg, models, test_records, monkeypatch,
                                                                        caplog):
    """captioner.compile (issue 38's follow-up): the compiled beam step, loaded through the config like a job's
    captioner (torch.compile's aot_eager backend: the same captured graph, no C compiler), gives the
    uncompiled beams; off, the step is the plain function; on a CPU, inductor is ignored, said once."""
    import logging

    import torch
    from torch._dynamo.utils import counters

    from adjcap.models import decoding
    from adjcap.engine import stage_registry

    monkeypatch.delenv("ADJCAP_NUMERICS", raising=False)
    from adjcap.config import list_presets, load_config

    eager = decoding._gpt_step
    assert {name: load_config(name).captioner.compile for name in list_presets()} == dict.fromkeys(list_presets(), "off")
    assert models.captioner.captioner.step is eager  # off: the plain function, nothing patched
    cfg = demo_cfg.model_copy(update={"captioner": demo_cfg.captioner.model_copy(update={"compile": "default"})})
    rcfg = cfg.resolved()
    decoding._say_ignored_on_cpu.cache_clear()
    with caplog.at_level(logging.WARNING, logger="adjcap.models.decoding"):
        assert decoding.beam_step("default", "cpu") is eager and decoding.beam_step("default", "cpu") is eager
    assert sum("captioner.compile is ignored on a CPU" in r.getMessage() for r in caplog.records) == 1

    monkeypatch.setattr(decoding, "COMPILE_BACKEND", "aot_eager")
    torch._dynamo.reset()
    counters.clear()
    try:
        compiled = stage_registry.load_families(rcfg, ["captioner"], given={"nouns": models.captioner.nouns})
        assert compiled["captioner"].captioner.step is decoding.compiled_step("aot_eager", "default")
        recs = test_records[:3]
        plain = run_pipeline(recs, demo_cfg, models, batch_size=3)
        rows = run_pipeline(recs, cfg, _with(models, captioner=compiled["captioner"]), batch_size=3)
        assert counters["stats"]["unique_graphs"] >= 1  # the step did run compiled
    finally:
        torch._dynamo.reset()
    assert decoding._gpt_step is eager and models.captioner.captioner.step is eager  # nothing patched
    for got, want in zip(rows, plain):
        assert [c["text"] for c in got["candidates"]] == [c["text"] for c in want["candidates"]]
        assert [c["n_tokens"] for c in got["candidates"]] == [c["n_tokens"] for c in want["candidates"]]
        for a, b in zip(got["candidates"], want["candidates"]):
            assert abs(a["lm_logprob_sum"] - b["lm_logprob_sum"]) <= 1e-5
            assert abs(a["lm_logprob_mean"] - b["lm_logprob_mean"]) <= 1e-5


def test_a_halved_size_is_carried_per_stage_and_only_inside_its_owner():
    """run_batch outside :func:`adjcap.engine.stages.carrying` halves for the batch only; inside, per stage."""
    import torch

    from adjcap.engine.stages import HalvedSizes, carrying, run_batch

    sizes: list[int] = []

    def fits_two(part):
        sizes.append(len(part))
        if len(part) > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory.")

    for _ in range(2):
        run_batch("verify", fits_two, list(range(8)))
    assert sizes == [8, 4, 2, 2, 2, 2] * 2  # no owner: each batch fails once more at full size
    sizes.clear()
    carried = HalvedSizes()
    with carrying(carried):
        run_batch("verify", fits_two, list(range(8)))
        run_batch("verify", fits_two, list(range(8)))
        run_batch("caption", fits_two, list(range(3)))  # another stage keeps its own size
    assert sizes == [8, 4, 2, 2, 2, 2] + [2, 2, 2, 2] + [3, 1, 1, 1]
    assert carried.sizes == {"verify": 2, "caption": 1}
    sizes.clear()
    run_batch("verify", fits_two, list(range(4)))  # the owner's block is over
    assert sizes == [4, 2, 2]


def test_out_of_memory_with_one_image_fails_the_job_in_one_line(demo_cfg, models, test_records, monkeypatch):
    import torch

    from adjcap.engine.gpu_errors import GpuFailure

    monkeypatch.delenv("ADJCAP_NUMERICS", raising=False)
    enc = _FailsAbove(models.retrieval, "encode_images", 0, torch.cuda.OutOfMemoryError("CUDA out of memory."))
    with pytest.raises(GpuFailure) as got:
        run_pipeline(test_records[:4], demo_cfg, _with(models, retrieval=enc), batch_size=4)
    line = str(got.value)
    assert "\n" not in line and enc.sizes == [4, 2, 1]
    # in process the stages run as the one fused pool (adjcap.engine.local), named as on Ray
    assert line.startswith("pool fused, stage retrieve: out of GPU memory with one image (its batch of 4")
    assert "no GPU visible" in line  # the memory part (on a GPU: allocated, reserved, free of total)


@pytest.mark.parametrize("error", [
    RuntimeError("CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be reported"),
    RuntimeError("cuDNN error: CUDNN_STATUS_EXECUTION_FAILED"),
])
def test_a_cuda_error_is_not_an_error_row_but_the_jobs_end(demo_cfg, models, test_records, monkeypatch, error):
    from typer.testing import CliRunner

    import adjcap.cli as cli
    from adjcap.engine.gpu_errors import GpuFailure

    monkeypatch.delenv("ADJCAP_NUMERICS", raising=False)
    ver = _FailsAbove(models.verifier, "encode_images", 0, error)
    with pytest.raises(GpuFailure) as got:
        run_pipeline(test_records[:3], demo_cfg, _with(models, verifier=ver), batch_size=3)
    assert ver.sizes == [3]  # not retried image by image into three error rows
    assert str(got.value).startswith("pool fused, stage verify: GPU error in a batch of 3 images (RuntimeError: ")
    # as Ray hands it to the driver (pickled across, wrapped): the command line prints its one line
    import pickle

    import ray.exceptions

    wrapped = ray.exceptions.RayTaskError("map_batches", "Traceback ...\nmany lines", pickle.loads(pickle.dumps(got.value)))
    app = cli.app

    @app.command("boom-test")
    def boom() -> None:
        def job():
            try:
                raise wrapped
            except ray.exceptions.RayTaskError as e:
                raise RuntimeError("Ray Data: the map_batches operator failed\nmore") from e
        cli._run(job)

    try:
        res = CliRunner().invoke(app, ["boom-test"])
    finally:
        app.registered_commands.pop()
    assert res.exit_code == 2
    out = [line for line in res.output.splitlines() if line.strip()]
    assert out == [f"error: {got.value}  (--debug for the traceback)"], res.output



def test_the_stages_read_the_host_per_batch_not_per_image(demo_cfg, models, test_records, monkeypatch):
    """The retriever, verifier and scorer as a GPU would see them (adjcap.models.dispatch_audit, issue 38 item 2):
    the host reads of a stage's batch do not grow with its images (5 images read as often as 2); the
    captioner's decode has its own audit (tests/test_decode_audit.py)."""
    from adjcap.engine import image_state, stage_registry
    from adjcap.models.dispatch_audit import DispatchAudit

    monkeypatch.delenv("ADJCAP_NUMERICS", raising=False)  # whole batches
    cfg = demo_cfg.resolved()

    def reads(n: int) -> dict[str, dict[str, int]]:
        states = [image_state.decode_state(r.image_id, cfg.benchmark, r.split, r.domain, r.image_path)
                  for r in test_records[:n]]
        out = {}
        for stage in stage_registry.stages():
            if stage.name == "caption":  # audited apart, per decode step; unaudited here (much faster)
                stage.run(states, vars(models), cfg)
                continue
            audit = DispatchAudit()
            with audit:
                stage.run(states, vars(models), cfg)
            out[stage.name] = dict(audit.reads)
        assert all(s.ok for s in states)
        return out

    two, five = reads(2), reads(5)
    for stage in ("retrieve", "verify", "score"):
        assert sum(five[stage].values()) == sum(two[stage].values()), (stage, two[stage], five[stage])
        assert sum(five[stage].values()) <= 12, (stage, five[stage])

"""A candidates file (captioner.family = candidates, adjcap.data.candidates): hostile files refused in
one line naming the line, before Ray starts (the preflight, against the benchmark's images); JSONL and
Parquet read alike; the LM judge (a tiny GPT-2 built here) scores candidates without log-probs as the
model's own loss does; candidates with log-probs keep them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from adjcap.captioners import describe
from adjcap.config import load_config
from adjcap.data.candidates import CandidatesError, CandidateTable, read_candidates
from adjcap.image_state import ImageState
from adjcap.jobs import preflight
from adjcap.stages import caption_candidates


def _jsonl(path, rows, raw: bytes = b""):
    path.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in rows) + raw)
    return path


GOOD = {"image": "demo-test-0000.png", "candidates": ["a red ball.", "a blue kite."]}


@pytest.mark.parametrize("raw, line, words", [
    (b"\xff\xfe not text\n", 2, "not valid UTF-8"),
    (b'{"image": "demo-test-0001.png", "candidates": ["a"\n', 2, "not valid JSON"),
    (b'{"image": "demo-test-0001.png", "candidates": []}\n', 2, "non-empty list"),
    (b'{"image": "demo-test-0001.png", "candidates": ["a dog.", "  "]}\n', 2, "candidate 2 of 'demo-test-0001.png' is empty"),
    (b'{"image": "demo-test-0001.png", "candidates": ["a dog.", "a cat.", "a dog."]}\n', 2, "repeats candidate 1"),
    (b'{"image": "demo-test-0000.png", "candidates": ["a dog."]}\n', 2, "again (first on line 1)"),
    (b'{"image": "demo-test-0001.png", "candidates": ["a dog."], "logprobs": [1, 2]}\n', 2, "list of 1 numbers"),
    (b'\n{"image": "demo-test-0001.png", "candidates": ["a dog."], "logprobs": ["x"]}\n', 3, "finite number"),
    (b'{"image": "", "candidates": ["a dog."]}\n', 2, "'image' is missing"),
    (b'["a dog."]\n', 2, "must be a JSON object"),
])
def test_a_hostile_file_is_one_line_naming_the_line(tmp_path, raw, line, words):
    p = _jsonl(tmp_path / "c.jsonl", [GOOD], raw)
    with pytest.raises(CandidatesError) as e:
        read_candidates(p)
    msg = str(e.value)
    assert "\n" not in msg and f"{p}:{line}:" in msg and words in msg, msg


def test_the_preflight_refuses_an_unknown_image_before_ray(demo_cfg, tmp_path):
    p = _jsonl(tmp_path / "c.jsonl", [GOOD, {"image": "not-in-the-world.png", "candidates": ["a dog."]}])
    cfg = load_config("demo", [f"paths.cache_dir={demo_cfg.paths.cache_dir}", "captioner.family=candidates",
                               f"captioner.candidates.file={p}"]).resolved()
    why = preflight.problems(cfg)
    assert why is not None and f"{p}:2: image 'not-in-the-world.png' is not in the benchmark" in why and "\n" not in why
    with pytest.raises(preflight.PreflightError):
        preflight.check(cfg)
    ok = _jsonl(tmp_path / "ok.jsonl", [GOOD, {"image": "images/demo-val-0003.png", "candidates": ["a dog."],
                                               "logprobs": [-3.0], "n_tokens": [3]}])
    assert preflight.candidates_problem(cfg.model_copy(update={"captioner": cfg.captioner.model_copy(
        update={"candidates": cfg.captioner.candidates.model_copy(update={"file": str(ok)})})})) is None


@pytest.fixture(scope="module")
def judge(demo_cfg, tmp_path_factory):
    """A tiny random GPT-2 with the demo world's GPT-2 tokenizer, saved and loaded as a directory."""
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    from adjcap.models.text_lm import load_text_lm

    out = tmp_path_factory.mktemp("tiny-gpt2")
    tok = AutoTokenizer.from_pretrained(f"{demo_cfg.resolved().paths.cache_dir}/tiny/gpt2-tokenizer")
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=64, n_embd=32, n_layer=2, n_head=2,
                               bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id)).save_pretrained(out)
    tok.save_pretrained(out)
    return load_text_lm(str(out), device="cpu")


def test_the_lm_judge_scores_what_the_models_own_loss_says(judge, tmp_path):
    rows = [{"image": "a.png", "candidates": ["a red ball on the grass.", "two kites."], "logprobs": None,
             "n_tokens": None, "logprob_means": None},
            {"image": "b.png", "candidates": ["a clock.", "a white clock on a wall."], "logprobs": [-2.5, -7.0],
             "n_tokens": [4, 7], "logprob_means": [-0.625, -1.0]}]
    path = tmp_path / "c.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)  # Parquet: the same columns (missing ones null)
    table = CandidateTable(read_candidates(path), str(path))
    assert table.needs_lm
    cfg = load_config("demo", ["captioner.family=candidates", f"captioner.candidates.file={path}",
                               f"captioner.candidates.lm={judge.model_id}"])
    assert f"LM judge {judge.model_id} (text only)" in describe(cfg)  # what the run's report says
    states = [ImageState("a.png", "x", "test"), ImageState("b.png", "x", "test")]
    caption_candidates(states, table, judge, load_config("demo").captioner)
    assert all(s.error is None for s in states), [s.error for s in states]
    a, b = states
    for j, c in enumerate(a.candidates):
        ids = torch.tensor([[judge.start_id, *judge.ids(c["text"])]])
        loss = judge.model(input_ids=ids, labels=ids).loss.item()  # mean NLL of every token after the start
        assert c["n_tokens"] == ids.shape[1] - 1 and c["beam_rank"] == j
        assert math.isclose(c["lm_logprob_mean"], -loss, rel_tol=1e-5)
        assert math.isclose(c["lm_logprob_sum"], c["lm_logprob_mean"] * c["n_tokens"], rel_tol=1e-9)
    assert [(c["lm_logprob_sum"], c["n_tokens"], c["lm_logprob_mean"]) for c in b.candidates] == \
        [(-2.5, 4, -0.625), (-7.0, 7, -1.0)]
    assert all(math.isnan(c["verifier"]) for s in states for c in s.candidates)  # stage 4's, still to come


def test_caption_with_a_bad_candidates_file_is_refused_before_ray(demo_cfg, tmp_path):
    import shutil

    import ray
    from typer.testing import CliRunner

    from adjcap.cli import app

    folder = tmp_path / "mine"
    folder.mkdir()
    src = next(Path(demo_cfg.resolved().benchmark_cfg().images).glob("demo-test-*.png"))
    shutil.copyfile(src, folder / "photo.png")
    bad = _jsonl(tmp_path / "c.jsonl", [{"image": "photo.png", "candidates": ["a red ball."]},
                                        {"image": "elsewhere.png", "candidates": ["a dog."]}])
    res = CliRunner().invoke(app, ["caption", str(folder), "--preset", "demo", "--candidates", str(bad),
                                   "--set", f"paths.cache_dir={demo_cfg.paths.cache_dir}"])
    lines = [x for x in res.output.strip().splitlines() if x.startswith("error:")]
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert f"{bad}:2: image 'elsewhere.png' is not in the benchmark" in lines[0]
    assert not ray.is_initialized()


def test_a_relative_candidates_file_is_made_absolute_so_its_identity_is_its_content(tmp_path, monkeypatch):
    from adjcap.identity import content_id

    monkeypatch.chdir(tmp_path)
    _jsonl(tmp_path / "mine.jsonl", [GOOD])
    cfg = load_config("demo", ["captioner.family=candidates", "captioner.candidates.file=mine.jsonl"])
    assert cfg.captioner.candidates.file == str(tmp_path / "mine.jsonl")
    assert content_id(cfg.captioner.candidates.file).startswith("file:")  # a rewritten file changes the identity

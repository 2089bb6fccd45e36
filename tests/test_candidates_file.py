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

from adjcap.engine.captioners import describe
from adjcap.config import load_config
from adjcap.data.candidates import CandidatesError, CandidateTable, match_records, read_candidates
from adjcap.engine.image_state import ImageState
from adjcap.jobs import preflight
from adjcap.engine.stages import caption_candidates


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
    (b'{"image": "", "candidates": ["a dog."]}\n', 2, "'image' is empty"),
    (b'["a dog."]\n', 2, "must be a JSON object"),
    # the true reason, not a neighbouring one (issue 47)
    (b'{"candidates": ["a dog."]}\n', 2, "'image' is missing"),
    (b'{"image": 7, "candidates": ["a dog."]}\n', 2, "'image' is a number (7), not a string"),
    (b'{"image": "demo-test-0001.png", "candidates": ["a dog.", 3]}\n', 2, "candidate 2 of 'demo-test-0001.png' "
     "is a number (3), not a string"),
    (b'{"image": "demo-test-0001.png", "candidates": [["a dog."]]}\n', 2, "candidate 1 of 'demo-test-0001.png' "
     "is a list"),
    (b'{"image": "./demo-test-0000.png", "candidates": ["a dog."]}\n', 2, "duplicate: image './demo-test-0000.png' "
     "again (first on line 1)"),
    (b'{"image": "../elsewhere/demo-test-0001.png", "candidates": ["a dog."]}\n', 2, "leaves the image folder"),
    (b'{"image": "demo-test-0001.png", "candidates": ["a \\ud800 dog."]}\n', 2,
     "candidate 1 of 'demo-test-0001.png' holds a lone surrogate '\\ud800' at character 3"),
    (b'{"image": "demo-\\udfff.png", "candidates": ["a dog."]}\n', 2, "'image' holds a lone surrogate"),
    (b'{"image": "demo-test-0001.png", "candidates": ["' + b"x" * 5001 + b'"]}\n', 2,
     "5001 characters, over the limit of 5000 (captioner.candidates.max_chars"),
    (b'{"image": "demo-test-0001.png", "candidates": ["a dog."], "logprobs": [0.5]}\n', 2,
     "'logprobs' item 1 is 0.5, above 0"),
    (b'{"image": "demo-test-0001.png", "candidates": ["a dog."], "logprobs": [-1.0], "logprob_means": [1e-9]}\n',
     2, "'logprob_means' item 1 is 1e-09, above 0"),
    (b'{"image": "demo-test-0001.png", "candidates": ["a dog."], "logprobs": [-1' + b"0" * 400 + b']}\n', 2,
     "'logprobs' item 1 is an integer of 401 digits"),
    (b'{"image": "demo-test-0001.png", "candidates": ["a dog."], "logprobs": [NaN]}\n', 2, "finite number"),
    (b'{"image": "demo-test-0001.png", "candidates": ["a dog."], "logprobs": [-1' + b"0" * 5000 + b']}\n', 2,
     "not usable JSON (Exceeds the limit"),
])
def test_a_hostile_file_is_one_line_naming_the_line(tmp_path, raw, line, words):
    p = _jsonl(tmp_path / "c.jsonl", [GOOD], raw)
    with pytest.raises(CandidatesError) as e:
        read_candidates(p)
    msg = str(e.value)
    assert "\n" not in msg and f"{p}:{line}:" in msg and words in msg, msg


def test_a_directory_a_parquet_int_column_and_the_length_setting(tmp_path):
    with pytest.raises(CandidatesError, match=f"candidates file {tmp_path} is a directory, give the file"):
        read_candidates(tmp_path)
    path = tmp_path / "c.parquet"
    pq.write_table(pa.Table.from_pylist([{"image": 3, "candidates": ["a dog."]}]), path)
    with pytest.raises(CandidatesError, match=f"{path}:1: 'image' is a number \\(3\\), not a string"):
        read_candidates(path)
    long = _jsonl(tmp_path / "long.jsonl", [{"image": "a.png", "candidates": ["a dog.", "a dog " * 10]}])
    with pytest.raises(CandidatesError, match=f"{long}:1: candidate 2 of 'a.png' is 60 characters, over the limit "
                       "of 20"):
        read_candidates(long, max_chars=20)
    assert read_candidates(long, max_chars=60)[0].texts[1] == "a dog " * 10


class _Rec:
    def __init__(self, image_id):
        self.image_id = image_id


@pytest.mark.parametrize("keys, ids, words", [
    # one bare name must not serve two pictures
    (["NAME.png"], ["a/NAME.png", "b/NAME.png"], ":1: image 'NAME.png' fits two images of the benchmark "
     "('a/NAME.png', 'b/NAME.png'); give its path under the image folder"),
    # a/NAME is never b/NAME's
    (["a/NAME.png"], ["b/NAME.png"], ":1: image 'a/NAME.png' is not in the benchmark"),
    # two spellings of one picture: a duplicate, not an image the benchmark lacks
    (["x.png", "images/x.png"], ["x.png"], ":2: duplicate: image 'images/x.png' is image 'x.png' again (given on "
     "line 1)"),
    (["sub/x.png", "x.png"], ["x.png"], ":1: duplicate: image 'sub/x.png' is image 'x.png' again (given on line 2)"),
    (["images/x.png", "other/x.png"], ["x.png"], ":2: duplicate: lines 1 ('images/x.png'), 2 ('other/x.png') all name "
     "image 'x.png'"),
    (["/elsewhere/x.png"], ["x.png"], ":1: image '/elsewhere/x.png' is outside the image folder"),
    (["x.png"], ["x.png", "y.png"], ": images of the benchmark have no line: 'y.png' (1 in all); add them, or set "
     "captioner.candidates.allow_missing=true"),
])
def test_lines_match_one_picture_each(tmp_path, keys, ids, words):
    p = _jsonl(tmp_path / "c.jsonl", [{"image": k, "candidates": ["a dog."]} for k in keys])
    table = CandidateTable(read_candidates(p), str(p))
    with pytest.raises(CandidatesError) as e:
        match_records(table, [_Rec(i) for i in ids], str(tmp_path), allow_missing=False)
    assert f"{p}{words}" in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_what_the_preflight_accepts_the_job_finds(tmp_path):
    keys = ["val2014/COCO_1.jpg", "COCO_2.jpg", "a/NAME.png", "b/NAME.png", f"{tmp_path}/sub/c.png"]
    p = _jsonl(tmp_path / "c.jsonl", [{"image": k, "candidates": [f"caption {k}"]} for k in keys])
    table = CandidateTable(read_candidates(p), str(p))
    ids = ["COCO_1.jpg", "val2014/COCO_2.jpg", "a/NAME.png", "b/NAME.png", "sub/c.png", "not-there.png"]
    got = match_records(table, [_Rec(i) for i in ids], str(tmp_path), captioned=ids[:-1], allow_missing=False)
    assert {i: s.image for i, s in got.items()} == dict(zip(ids, keys))
    assert all(table.get(i) is got[i] for i in got) and table.get("not-there.png") is None


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

    def given(**kw):
        return cfg.model_copy(update={"captioner": cfg.captioner.model_copy(
            update={"candidates": cfg.captioner.candidates.model_copy(update={"file": str(ok), **kw})})})

    why = preflight.candidates_problem(given())  # every other image of the benchmark lacks a line
    assert f"{ok}: " in why and "images of the benchmark have no line" in why and "allow_missing" in why
    assert preflight.candidates_problem(given(allow_missing=True)) is None
    one = load_config("demo", [f"paths.cache_dir={demo_cfg.paths.cache_dir}", "captioner.family=candidates",
                               f"captioner.candidates.file={_jsonl(tmp_path / 'one.jsonl', [GOOD])}", "limit=1",
                               "splits=[\"test\"]"]).resolved()
    assert preflight.candidates_problem(one) is None  # the job captions demo-test-0000.png only


def test_a_file_without_token_counts_needs_the_judges_tokenizer_before_ray(demo_cfg, tmp_path):
    """log-probs without n_tokens (a documented shape): the LM judge's tokenizer counts them, so it is
    checked with the weights; log-probs and counts together need no judge at all."""
    counted = _jsonl(tmp_path / "counted.jsonl", [{**GOOD, "logprobs": [-1.0, -2.0], "n_tokens": [3, 3]}])
    uncounted = _jsonl(tmp_path / "uncounted.jsonl", [{**GOOD, "logprobs": [-1.0, -2.0]}])
    gone = tmp_path / "no-such-judge"

    def why(file):
        return preflight.problems(load_config("demo", [
            f"paths.cache_dir={demo_cfg.paths.cache_dir}", "captioner.family=candidates", "limit=1",
            "splits=[\"test\"]", f"captioner.candidates.file={file}", f"captioner.candidates.lm={gone}"]).resolved())

    assert why(counted) is None
    msg = why(uncounted)
    assert msg is not None and f"LM judge's tokenizer (rows without n_tokens) {gone}" in msg and "\n" not in msg


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


def _caption(demo_cfg, folder, candidates, *more):
    from typer.testing import CliRunner

    from adjcap.cli import app

    res = CliRunner().invoke(app, ["caption", str(folder), "--preset", "demo", "--candidates", str(candidates),
                                   "--set", f"paths.cache_dir={demo_cfg.paths.cache_dir}", *more])
    return res, [x for x in res.output.strip().splitlines() if x.startswith("error:")]


@pytest.mark.parametrize("rows, words", [
    ([{"image": "a/photo.png", "candidates": ["a red ball."]}, {"image": "b/photo.png", "candidates": ["a kite."]},
      {"image": "elsewhere.png", "candidates": ["a dog."]}], "c.jsonl:3: image 'elsewhere.png' is not in the benchmark"),
    # one bare name must not serve both pictures
    ([{"image": "photo.png", "candidates": ["a red ball."]}], "c.jsonl:1: image 'photo.png' fits two images of the "
     "benchmark ('a/photo.png', 'b/photo.png')"),
    # a path outside the folder is not the folder's file of the same name
    ([{"image": "b/photo.png", "candidates": ["a red ball."]},
      {"image": "../elsewhere/a/photo.png", "candidates": ["a dog."]}], "c.jsonl:2: image "
     "'../elsewhere/a/photo.png' leaves the image folder"),
    # every image of the folder has its line (they would fail one by one after Ray started)
    ([{"image": "a/photo.png", "candidates": ["a red ball."]}], "c.jsonl: images of the benchmark have no line: "
     "'b/photo.png'"),
    (None, "is a directory, give the file"),
])
def test_caption_with_a_bad_candidates_file_is_refused_before_ray(demo_cfg, tmp_path, rows, words):
    import shutil

    import ray

    folder = tmp_path / "mine"
    src = next(Path(demo_cfg.resolved().benchmark_cfg().images).glob("demo-test-*.png"))
    for sub in ("a", "b"):
        (folder / sub).mkdir(parents=True)
        shutil.copyfile(src, folder / sub / "photo.png")
    bad = _jsonl(tmp_path / "c.jsonl", rows) if rows is not None else tmp_path
    res, lines = _caption(demo_cfg, folder, bad)
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert words in lines[0] and "Traceback" not in res.output, lines[0]
    assert not ray.is_initialized() and not list(tmp_path.glob("runs*"))


def test_a_refused_caption_advises_only_options_it_has(demo_cfg, tmp_path):
    """A run directory holding features of other settings: `caption` says to rerun with --fresh, and
    has it."""
    import ray

    from adjcap.storage.parts import PART_GLOB

    folder = tmp_path / "mine"
    folder.mkdir()
    src = next(Path(demo_cfg.resolved().benchmark_cfg().images).glob("demo-test-*.png"))
    (folder / "photo.png").write_bytes(src.read_bytes())
    good = _jsonl(tmp_path / "c.jsonl", [{"image": "photo.png", "candidates": ["a red ball."], "logprobs": [-2.0],
                                          "n_tokens": [4]}])
    run = tmp_path / "run"
    (run / "features" / "folder").mkdir(parents=True)
    (run / "features" / "identity.json").write_text(json.dumps({"made": "otherwise"}))
    (run / "features" / "folder" / PART_GLOB.replace("*", "0")).write_bytes(b"")
    res, lines = _caption(demo_cfg, folder, good, "--run-dir", str(run))
    assert res.exit_code == 2 and len(lines) == 1 and "rerun with --fresh" in lines[0], res.output
    assert not ray.is_initialized()
    from typer.testing import CliRunner

    from adjcap.cli import app

    assert "--fresh" in CliRunner().invoke(app, ["caption", "--help"]).output


def test_a_relative_candidates_file_is_made_absolute_so_its_identity_is_its_content(tmp_path, monkeypatch):
    from adjcap.engine.identity import content_id

    monkeypatch.chdir(tmp_path)
    _jsonl(tmp_path / "mine.jsonl", [GOOD])
    cfg = load_config("demo", ["captioner.family=candidates", "captioner.candidates.file=mine.jsonl"])
    assert cfg.captioner.candidates.file == str(tmp_path / "mine.jsonl")
    assert content_id(cfg.captioner.candidates.file).startswith("file:")  # a rewritten file changes the identity

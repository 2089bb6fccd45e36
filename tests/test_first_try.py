"""A newcomer's first commands: `adjcap caption` / `run-job` refuse before Ray starts and leave no
run directory when the preset's weights are not here (naming them and the one `adjcap prepare` command);
`prepare --for PRESET|TABLE` covers exactly what its runs load; `doctor` exits non-zero when something
needed (here: NLTK's tagger data) is missing; `reproduce --list` says per table ready / missing; the
demo preset warns on images that are not the demo world; captions.jsonl and the gallery survive a
moved folder. No Ray is started here."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from adjcap.config import load_config
from adjcap.prepare import Options, run as prepare_run
from adjcap.prepare.download import Downloader

FIXTURES = Path(__file__).parent / "fixtures" / "data" / "images"


@pytest.fixture
def bare_machine(tmp_path, monkeypatch):
    """A machine with no downloaded weights: empty Hugging Face and open_clip caches, offline, an
    empty data root."""
    import huggingface_hub.constants as hf

    hub = tmp_path / "hf-empty"
    hub.mkdir()
    monkeypatch.setattr(hf, "HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # open_clip's URL cache ~/.cache/clip
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("ADJCAP_DATA", str(tmp_path / "data"))
    return tmp_path


def _photos(tmp_path: Path) -> Path:
    folder = tmp_path / "photos"
    folder.mkdir()
    for p in FIXTURES.glob("*.jpg"):
        shutil.copy(p, folder / p.name)
    return folder


def _cli(*args: str):
    from adjcap.cli import app

    return CliRunner().invoke(app, list(args))


def _error_line(output: str) -> str:
    lines = [x for x in output.splitlines() if x.startswith("error:")]
    assert len(lines) == 1, output
    return lines[0]


def test_caption_without_weights_refuses_before_anything_is_written(bare_machine):
    folder = _photos(bare_machine)
    runs = bare_machine / "runs"
    res = _cli("caption", str(folder), "--set", f"paths.runs_dir={runs}",
               "--set", f"paths.data_dir={bare_machine / 'data'}")
    assert res.exit_code != 0
    line = _error_line(res.output)
    for missing in ("retrieval encoder ViT-bigG-14/laion2b_s39b_b160k", "verifier Salesforce/blip-itm-large-coco",
                    "IFCap checkpoint", "IFCap CLIP ViT-B-32/openai", "GPT-2 tokenizer gpt2"):
        assert missing in line
    assert "retrieval caption corpus" in line
    # the one command that fetches exactly what is missing (caption needs no COCO images)
    assert "(fetch with `adjcap prepare ifcap models nltk --preset headline`)" in line
    assert not runs.exists()  # no run directory, no config, no empty folders
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in FIXTURES.glob("*.jpg"))


def test_run_job_refuses_the_same_way(bare_machine):
    runs = bare_machine / "runs"
    res = _cli("run-job", "coco", "--set", f"paths.runs_dir={runs}", "--set", f"paths.data_dir={bare_machine / 'data'}")
    assert res.exit_code != 0
    line = _error_line(res.output)
    assert "retrieval encoder ViT-bigG-14/laion2b_s39b_b160k" in line and "coco test references" in line
    assert "(fetch with `adjcap prepare ifcap coco models nltk --preset headline`)" in line
    assert not runs.exists()


def test_caption_refuses_a_memory_plan_that_cannot_fit(demo_cfg, tmp_path, monkeypatch):
    """Weights present (the demo's tiny models) on a machine whose local Ray would leave 1 GB for
    actors: four pools of one actor each cannot be placed, refused before Ray starts."""
    from adjcap.jobs import preflight

    monkeypatch.setattr(preflight, "local_cluster", lambda: {"CPU": 2.0, "GPU": 0.0, "memory": 1e9})
    folder = _photos(tmp_path)
    runs = tmp_path / "runs"
    # split pools: one fused actor (auto on this GPU-less machine) would fit in the 1 GB
    res = _cli("caption", str(folder), "--preset", "demo", "--set", f"paths.cache_dir={demo_cfg.paths.cache_dir}",
               "--set", f"paths.runs_dir={runs}", "--set", "ray.pools=split")
    assert res.exit_code != 0
    line = _error_line(res.output)
    assert "resource plan: --workers 1: 1 x (retriever" in line and "of memory, the cluster has 953.7 MiB" in line
    assert "missing" not in line
    assert not runs.exists()


# --------------------------------------------------------------------------------------------
# prepare --for
# --------------------------------------------------------------------------------------------


def _dry_run(tmp_path: Path, monkeypatch, what: list[str], targets: list[str]) -> str:
    monkeypatch.setattr(Downloader, "head_size", lambda self, url: None)  # no network in tests
    lines: list[str] = []
    opts = Options(data=tmp_path / "data", dry_run=True, targets=targets)
    assert prepare_run(what, opts, say=lines.append) == 0
    assert not (tmp_path / "data").exists()  # --dry-run writes nothing
    return "\n".join(lines)


def test_prepare_for_a_table_lists_exactly_its_models(bare_machine, monkeypatch):
    ablation = _dry_run(bare_machine, monkeypatch, [], ["ablation"])
    assert "retrieval encoder RN50x64/openai" in ablation  # row 1: IFCap's official retrieval encoder
    assert "Salesforce/blip-itm-large-coco" in ablation and "blip-itm-large-flickr" not in ablation
    assert "ifcap checkpoints" in ablation and "coco:" in ablation and "nltk punkt_tab" in ablation
    assert "nocaps" not in ablation and "flickr30k" not in ablation
    substrate = _dry_run(bare_machine, monkeypatch, [], ["verifier-substrate"])
    assert "verifier Salesforce/blip-itm-large-flickr" in substrate and "RN50x64/openai" in substrate
    headline = _dry_run(bare_machine, monkeypatch, [], ["headline"])
    assert "RN50x64" not in headline and "blip-itm-large-flickr" not in headline
    assert "ViT-bigG-14/laion2b_s39b_b160k" in headline


def test_prepare_all_includes_every_tables_models(bare_machine, monkeypatch):
    everything = _dry_run(bare_machine, monkeypatch, ["all"], [])
    assert "RN50x64/openai" in everything and "Salesforce/blip-itm-large-flickr" in everything


def test_prepare_for_an_unknown_name_is_one_line(bare_machine):
    res = _cli("prepare", "--for", "ablaton", "--dry-run", "--data", str(bare_machine / "data"))
    assert res.exit_code == 1
    line = _error_line(res.output)
    assert "ablaton" in line and "headline" in line and "ablation" in line


# --------------------------------------------------------------------------------------------
# doctor
# --------------------------------------------------------------------------------------------


NLTK_LAYOUT = ("tokenizers/punkt_tab/english", "taggers/averaged_perceptron_tagger_eng", "corpora/wordnet")


def test_doctor_exits_non_zero_when_the_nltk_tagger_data_is_missing(demo_cfg, tmp_path, monkeypatch):
    import nltk

    empty = tmp_path / "nltk_data"
    empty.mkdir()
    monkeypatch.setenv("NLTK_DATA", str(empty))
    monkeypatch.delenv("ADJCAP_NLTK_DATA", raising=False)
    monkeypatch.setenv("ADJCAP_DATA", str(tmp_path / "data"))
    monkeypatch.setattr(nltk.data, "path", [str(empty)])  # not the machine's own nltk_data either
    args = ("doctor", "--preset", "demo", "--set", f"paths.cache_dir={demo_cfg.paths.cache_dir}",
            "--set", "captioner.entities.tagger=nltk")
    res = _cli(*args)
    assert res.exit_code == 1, res.output
    assert "MISSING  NLTK data averaged_perceptron_tagger_eng (entity filter)  -> adjcap prepare --for demo" in res.output
    verdict = next(x for x in res.output.splitlines() if x.startswith("not ready"))
    assert "NLTK data punkt_tab" in verdict
    # the tiny models are all there: no weights line is missing
    assert "MISSING  retrieval encoder" not in res.output and "MISSING  verifier" not in res.output
    for sub in NLTK_LAYOUT:  # the data laid out: NLTK is no longer a problem
        (empty / sub).mkdir(parents=True)
    res = _cli(*args)
    assert f"ok       NLTK data averaged_perceptron_tagger_eng (entity filter)  ({empty / NLTK_LAYOUT[1]}" in res.output
    assert "NLTK" not in "\n".join(x for x in res.output.splitlines() if x.startswith("not ready"))


def test_doctor_asks_for_spice_jars_only_when_the_preset_scores_spice(demo_cfg, bare_machine):
    cache = f"paths.cache_dir={demo_cfg.paths.cache_dir}"
    assert "SPICE CoreNLP" not in _cli("doctor", "--preset", "demo", "--set", cache).output  # eval.spice=false
    res = _cli("doctor", "--preset", "demo", "--set", cache, "--set", "eval.spice=true",
               "--set", f"eval.spice_jars={bare_machine / 'no-jars'}")
    assert res.exit_code == 1 and "MISSING  SPICE CoreNLP 3.6.0 jars" in res.output


# --------------------------------------------------------------------------------------------
# reproduce --list
# --------------------------------------------------------------------------------------------


def test_reproduce_list_says_per_table_what_is_missing_and_the_prepare_command(bare_machine):
    from adjcap.reproduce import load_tables

    res = _cli("reproduce", "--list")
    assert res.exit_code == 0, res.output
    status = [x.strip() for x in res.output.splitlines() if x.strip().startswith("status:")]
    assert len(status) == len(load_tables())
    for key, line in zip(load_tables(), status):
        assert line.startswith("status: missing") and line.endswith(f"-> adjcap prepare --for {key}")
    ablation = status[list(load_tables()).index("ablation")]
    assert "retrieval encoder RN50x64/openai" in ablation


# --------------------------------------------------------------------------------------------
# the demo preset on foreign images; portable outputs
# --------------------------------------------------------------------------------------------


def test_demo_preset_warns_on_images_that_are_not_the_demo_world(demo_cfg, tmp_path):
    from adjcap.jobs.caption import demo_world_mismatch

    rcfg = demo_cfg.resolved()
    world = Path(rcfg.benchmark_cfg("demo").images)
    own = tmp_path / "own"
    own.mkdir()
    for p in sorted(world.glob("demo-test-000*.png"))[:3]:
        shutil.copy(p, own / p.name)
    assert demo_world_mismatch(rcfg, own) is None
    photos = _photos(tmp_path)
    warning = demo_world_mismatch(rcfg, photos)
    assert warning.startswith("warning:") and "2 of 2 images" in warning and "\n" not in warning
    # a renamed photo does not pass as a demo image: name and size must both be the world's
    shutil.copy(sorted(photos.glob("*.jpg"))[0], own / "demo-test-0100.png")
    assert "1 of 4 images" in demo_world_mismatch(rcfg, own)
    assert demo_world_mismatch(load_config("headline").resolved(), photos) is None  # real presets: no warning


def test_captions_and_gallery_survive_a_moved_folder(tmp_path):
    from adjcap.report.captions import caption_records, write_gallery

    folder = _photos(tmp_path)
    (folder / "sub").mkdir()
    shutil.copy(sorted(folder.glob("*.jpg"))[0], folder / "sub" / "a b.jpg")
    ids = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.jpg"))
    cand = {"text": "a photo", "lm_logprob_mean": -1.0, "retrieval_cosine": 0.3, "verifier": 0.5, "beam_rank": 0}
    rows = [{"image_id": i, "candidates": [cand], "error": None} for i in ids]
    records = caption_records(rows, {i: 0 for i in ids}, {i: 0 for i in ids}, folder, "fixed")
    assert [r["image"] for r in records] == ids  # relative to the captioned folder
    absolute = caption_records(rows, {i: 0 for i in ids}, {i: 0 for i in ids}, folder, "fixed", absolute=True)
    assert [r["image"] for r in absolute] == [str(folder / i) for i in ids]
    page = write_gallery(folder / "captions.html", records, title="t", image_root=folder)
    moved = tmp_path / "elsewhere" / "photos"
    moved.parent.mkdir()
    folder.rename(moved)
    text = (moved / page.name).read_text()
    assert str(folder) not in text and str(tmp_path) not in text
    from urllib.parse import unquote

    import re

    hrefs = re.findall(r"<a href='([^']+)'>", text)
    assert len(hrefs) == len(ids) and all((moved / unquote(h)).is_file() for h in hrefs)


def test_doctor_on_a_fresh_checkout_says_make_demo(tmp_path):
    """No demo world and no tiny models in the cache: every missing file is one `make demo` builds."""
    res = _cli("doctor", "--preset", "demo", "--set", f"paths.cache_dir={tmp_path / 'empty-cache'}")
    assert res.exit_code == 1, res.output
    missing = [x for x in res.output.splitlines() if x.strip().startswith("MISSING")]
    assert any("tiny/blip-itm" in x for x in missing) and any("demo images" in x for x in missing)
    assert all(x.endswith("-> make demo (or `adjcap demo`) builds the demo world and its tiny models")
               for x in missing), missing
    assert "put the file there" not in res.output
    assert res.output.rstrip().splitlines()[-1].startswith("build what is missing: make demo")


# --------------------------------------------------------------------------------------------
# Java before Ray
# --------------------------------------------------------------------------------------------


def test_a_job_that_evaluates_refuses_without_java_before_ray(demo_cfg, tmp_path):
    """`run-job` scores its captions (PTB tokenizer, METEOR: Java): without Java it is refused in one line
    before Ray starts and before anything is written; `caption` does not evaluate and does not ask."""
    from adjcap.jobs import preflight

    no_java = str(tmp_path / "no-jre" / "bin" / "java")
    rcfg = demo_cfg.model_copy(update={"eval": demo_cfg.eval.model_copy(update={"java": no_java})}).resolved()
    why = preflight.problems(rcfg)
    assert why is not None and "missing Java 11+ (PTB tokenizer, METEOR)" in why and "eval.java" in why
    assert preflight.problems(rcfg, evaluates=False) is None
    runs = tmp_path / "runs"
    res = _cli("run-job", "demo", "--set", f"paths.cache_dir={demo_cfg.paths.cache_dir}",
               "--set", f"paths.runs_dir={runs}", "--set", f"eval.java={no_java}")
    assert res.exit_code == 2, res.output
    assert "missing Java 11+" in _error_line(res.output)
    assert not runs.exists()

"""A job whose images failed says so: one summary line, exit code 65, and a stop once more than
ray.max_failed_share of the images back failed (adjcap.jobs.failures; issue 47 item 3)."""

import shutil

import pytest

from adjcap.config import CaptionerCfg
from adjcap.data.candidates import CandidateSet, CandidateTable
from adjcap.data.records import Record
from adjcap.engine.features import rows_to_table
from adjcap.engine.image_state import ImageState, decode_state
from adjcap.jobs import failures
from adjcap.jobs.failures import CHECK_AFTER, EXIT_FAILED_IMAGES, FailureWatch, ImagesFailed, TooManyFailures
from adjcap.storage.rundir import RunDir
from adjcap.engine.stages import caption_candidates


def _batch(start, n, failing):
    ids = [f"img-{i}" for i in range(start, start + n)]
    return ids, [f"decode: cannot decode {i}.png" if failing(i) else None for i in range(start, start + n)]


def test_a_job_whose_every_image_fails_stops_once_the_first_images_are_back():
    watch = FailureWatch(images=1000, max_share=0.5)
    batches = 0
    with pytest.raises(TooManyFailures) as stop:
        for start in range(0, 1000, 8):
            batches += 1
            watch.add(*_batch(start, 8, lambda i: True))
    assert batches * 8 == CHECK_AFTER  # the first check, not the job's end
    assert str(stop.value).startswith(f"{CHECK_AFTER} of {CHECK_AFTER} images failed; first: img-0 decode: cannot "
                                      "decode 0.png; stopped after 32 of 1000 images")
    assert "\n" not in str(stop.value) and stop.value.exit_code == EXIT_FAILED_IMAGES


def test_failures_under_the_share_never_stop_the_job():
    watch = FailureWatch(images=200, max_share=0.5)
    for start in range(0, 200, 8):  # every other image fails: half, not more than half
        watch.add(*_batch(start, 8, lambda i: i % 2 == 0))
    watch.check()
    assert (watch.seen, watch.failed) == (200, 100)
    never = FailureWatch(images=40, max_share=1.0)
    for start in range(0, 40, 8):
        never.add(*_batch(start, 8, lambda i: True))
    never.check()


def test_a_small_job_is_checked_when_all_its_images_are_back():
    watch = FailureWatch(images=5, max_share=0.5)
    watch.add(*_batch(0, 3, lambda i: i > 0))  # 2 of 3: not all back yet
    with pytest.raises(TooManyFailures, match="^3 of 5 images failed; first: img-1 "):
        watch.add(*_batch(3, 2, lambda i: i == 3))


def test_the_run_reports_its_failed_images_in_one_line(tmp_path, capsys):
    run = RunDir(tmp_path / "run")
    recs = {"test": [Record(f"im{i}", f"/x/im{i}.png", ("a ref.",), split="test") for i in range(4)]}
    states = [decode_state(f"im{i}", "demo", "test", None, f"/x/im{i}.png", "missing file /x/im1.png" if i == 1 else None)
              if i == 1 else ImageState(f"im{i}", "demo", "test") for i in range(4)]
    run.write_part("demo", "test", rows_to_table([s.to_row() for s in states]))
    with pytest.raises(ImagesFailed) as e:
        failures.report(run, "demo", recs, strict=True)
    assert str(e.value) == "1 of 4 images failed; first: im1 decode: missing file /x/im1.png"
    failures.report(run, "demo", recs, strict=False)  # the Python API: printed, the run returned
    assert capsys.readouterr().out.strip() == str(e.value)
    failures.report(run, "demo", {"test": recs["test"][2:]}, strict=True)  # the current images did not fail


def test_the_command_line_ends_with_the_line_and_exit_65(monkeypatch):
    from typer.testing import CliRunner

    import adjcap.jobs.demo as demo_job
    from adjcap.cli import app

    def job(cfg, **kwargs):
        assert kwargs["strict"]  # the command line asks for the exit code
        raise ImagesFailed("3 of 3 images failed; first: a.png decode: cannot decode a.png")

    monkeypatch.setattr(demo_job, "main", job)
    res = CliRunner().invoke(app, ["run-job", "demo"])
    assert res.exit_code == 65
    assert res.output.strip().splitlines() == ["3 of 3 images failed; first: a.png decode: cannot decode a.png"]


class _TokenizerFails:
    def count(self, texts):
        raise TypeError("cannot count the tokens of a lone surrogate")


def test_an_image_whose_candidates_fail_names_their_file_and_line():
    table = CandidateTable([CandidateSet("a.png", 1, ("a cat.",), (-1.0,), (2,)),
                            CandidateSet("b.png", 2, ("a dog.",), (-2.0,))], source="/in/cands.jsonl")
    states = [ImageState("a.png", "folder", "test"), ImageState("b.png", "folder", "test")]
    caption_candidates(states, table, _TokenizerFails(), CaptionerCfg())
    assert states[0].error is None and states[0].candidates
    assert states[1].error.startswith("caption: ValueError: /in/cands.jsonl:2: image 'b.png': TypeError: cannot count")


@pytest.mark.slow
def test_a_job_whose_every_image_is_corrupt_exits_65_with_one_line(demo_cfg, tmp_path):
    """`adjcap run-job demo` on a copy of the demo world whose image files are all garbage: it stops
    after the first batches, before fitting, with one summary line and exit code 65."""
    from typer.testing import CliRunner

    from adjcap.cli import app

    b = demo_cfg.resolved().benchmark_cfg("demo")
    images = tmp_path / "images"
    shutil.copytree(b.images, images)
    for p in images.iterdir():
        p.write_bytes(b"not an image at all\n" * 4)
    run_dir = tmp_path / "run"
    res = CliRunner().invoke(app, [
        "run-job", "demo", "--workers", "1", "--run-dir", str(run_dir), "--limit", "40",
        "--set", f"paths.cache_dir={demo_cfg.paths.cache_dir}", "--set", "ray.include_dashboard=false",
        "--set", f"benchmarks.demo.images={images}", "--set", f"cache.stages_dir={tmp_path / 'stages'}"])
    assert res.exit_code == EXIT_FAILED_IMAGES, res.output
    lines = [ln for ln in res.output.splitlines() if "images failed" in ln]
    assert len(lines) == 1 and "; first: demo-" in lines[0] and "decode: not an image" in lines[0], res.output
    assert "stopped after" in lines[0] and "more than ray.max_failed_share=0.5" in lines[0]
    assert not (run_dir / "heads").exists()  # stopped before fitting
    kept = RunDir(run_dir).read_features("demo", "val", columns=["image_id", "error"]).to_pylist()
    assert kept and all(r["error"] for r in kept)  # what came back is kept: a rerun resumes

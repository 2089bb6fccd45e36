"""RunDir, the one owner of a run directory: round trips, part naming under concurrent writers,
the run lock, and the feature-settings identity."""

import multiprocessing as mp
import subprocess
import sys
import textwrap

import pyarrow as pa
import pytest

from adjcap.config import load_config
from adjcap.engine.identity import feature_identity
from adjcap.engine.features import empty_row, rows_to_table
from adjcap.storage.rundir import RunDir, RunDirError


def _table(ids):
    return rows_to_table([empty_row(i, "demo", "test", None, "decode: test row") for i in ids])


def test_round_trips(tmp_path):
    run = RunDir(tmp_path / "r")
    run.write_config('name = "x"\n')
    assert run.config_path.read_text() == 'name = "x"\n'
    run.write_references("coco", "test", {"a": ["one"], "b": ["two"]}, domains={"a": "in-domain"}, coco_ids={"a": 7})
    assert run.references("coco", "test") == {"a": ["one"], "b": ["two"]}
    assert run.domains("coco", "test") == {"a": "in-domain"} and run.coco_ids("coco", "test") == {"a": 7}
    assert run.reference_splits() == [("coco", "test")]
    run.write_references("coco", "test", {"a": ["one"]})  # no domains any more: the stale file goes
    assert run.domains("coco", "test") is None and run.coco_ids("coco", "test") == {}
    run.write_part("coco", "test", _table(["a", "b"]))
    run.write_part("coco", "test", _table(["c"]))
    assert run.done_ids("coco", "test") == {"a", "b", "c"}
    assert run.read_features("coco", "test").num_rows == 3
    assert run.read_features("coco", "test", image_ids={"a", "c"}).column("image_id").to_pylist() == ["a", "c"]
    assert run.current_ids("coco", "test") == {"a"}
    run.write_predictions("inductive", "lm", [{"image_id": "a", "caption": "x"}])
    assert run.prediction_protocols() == ["inductive"]
    assert list(run.prediction_files("inductive")) == ["lm"]
    assert run.predictions("inductive", "lm") == [{"image_id": "a", "caption": "x"}]
    run.write_metrics("inductive", {"pickers": {}})
    assert run.metrics_files() == [run.metrics_path("inductive")]
    run.write_fit_summary("inductive", {"alpha": 0.5})
    assert run.fit_summary("inductive") == {"alpha": 0.5}
    run.write_summary({"splits": {}})
    assert run.summary() == {"splits": {}}
    assert RunDir.default_for("runs", "headline", "coco").path.as_posix() == "runs/headline-coco"


def test_missing_features_name_the_command(tmp_path):
    with pytest.raises(FileNotFoundError, match="adjcap run-job coco"):
        RunDir(tmp_path).read_features("coco", "test")


def test_a_corrupt_json_names_the_file(tmp_path):
    run = RunDir(tmp_path)
    run.summary_path.parent.mkdir(parents=True)
    run.summary_path.write_text("{")
    with pytest.raises(ValueError, match="summary.json"):
        run.summary()


def _writer(path, tag, n):
    run = RunDir(path)
    for k in range(n):
        run.write_part("demo", "test", _table([f"{tag}-{k}"]))


def test_two_processes_writing_parts_never_collide(tmp_path):
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(tmp_path, t, 150)) for t in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    run = RunDir(tmp_path)
    assert len(run.parts("demo", "test")) == 300
    assert run.done_ids("demo", "test") == {f"{t}-{k}" for t in "ab" for k in range(150)}


def test_the_lock_refuses_a_second_job_and_names_the_holder(tmp_path):
    run = RunDir(tmp_path / "r")
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from adjcap.storage.rundir import RunDir
        with RunDir({str(tmp_path / 'r')!r}).lock():
            print("locked", flush=True)
            time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunDirError, match=f"pid {holder.pid} on host"):
            with run.lock():
                pass
    finally:
        holder.kill()
        holder.wait()
    with run.lock():  # the OS released the dead holder's lock
        pass


def test_the_lock_on_a_path_that_is_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(NotADirectoryError, match="not a directory"):
        with RunDir(tmp_path / "f").lock():
            pass


def test_other_feature_settings_are_refused_and_fresh_starts_over(tmp_path):
    run = RunDir(tmp_path)
    a = feature_identity(load_config("demo"))
    run.check_identity(a, fresh=False)
    run.write_part("demo", "test", _table(["x"]))
    run.check_identity(a, fresh=False)  # same settings: resume keeps the features
    assert run.done_ids("demo", "test") == {"x"}
    b = feature_identity(load_config("demo", ["captioner.beam_width=3"]))
    with pytest.raises(RunDirError, match=r"captioner.beam_width \(20 -> 3\).*--fresh"):
        run.check_identity(b, fresh=False)
    assert run.done_ids("demo", "test") == {"x"}  # nothing lost by the refusal
    run.check_identity(b, fresh=True)
    assert run.done_ids("demo", "test") == set()
    # batch sizes, workers and reranking never change what a feature row holds
    c = feature_identity(load_config("demo", ["captioner.beam_width=3", "captioner.batch_size=7", "ray.workers=3",
                                              "rerank.picker=lm", "limit=5"]))
    assert c == b


def test_a_corrupt_part_is_moved_aside_and_its_images_count_as_not_done(tmp_path, capsys):
    run = RunDir(tmp_path)
    good = run.write_part("demo", "test", _table(["a"]))
    bad = run.write_part("demo", "test", _table(["b", "c"]))
    bad.write_bytes(bad.read_bytes()[:40])  # truncated on disk
    assert run.done_ids("demo", "test") == {"a"}
    assert not bad.exists() and bad.with_name(bad.name + ".corrupt").exists() and good.exists()
    assert "unreadable" in capsys.readouterr().err
    assert run.read_features("demo", "test").num_rows == 1


def test_temp_files_of_a_killed_writer_are_removed_by_the_next_run_that_holds_the_lock(tmp_path):
    run = RunDir(tmp_path / "run")
    part = run.write_part("demo", "test", _table(["x"]))
    left = [part.parent / f".{part.name}.k1l2d3.tmp", run.path / "metrics" / ".inductive.json.a1b2.tmp"]
    for p in left:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"PAR1 half")
    other = RunDir(tmp_path / "other")
    theirs = other.path / "features" / ".part-1.parquet.zz.tmp"
    theirs.parent.mkdir(parents=True)
    theirs.write_bytes(b"half")
    with run.lock():
        assert not any(p.exists() for p in left)
        assert part.exists() and run.done_ids("demo", "test") == {"x"}
        # a live holder's temp files are never touched: a second job is refused before it looks
        live = part.parent / f".{part.name}.live.tmp"
        live.write_bytes(b"being written")
        with pytest.raises(RunDirError, match="in use"):
            with RunDir(run.path).lock():
                pass
        assert live.exists()
    assert theirs.exists()  # another run directory's files are its own run's business


def test_reading_a_run_back_config_settings_and_metrics(tmp_path):
    """RunDir is the one reader of a run (the Python API, the report, evaluate and the samples table
    call it): the config, the (benchmark, apply split) defaults a damaged config only loses, and the
    metrics documents by protocol, a file that is not JSON named."""
    run = RunDir(tmp_path / "r")
    with pytest.raises(FileNotFoundError, match="config.toml not found"):
        run.config()
    assert run.settings() == (None, "test")
    cfg = load_config("demo", ["rerank.apply_split=val"])
    run.write_config(cfg.to_toml())
    assert run.config().name == cfg.name
    assert run.settings() == (cfg.benchmark, "val")
    run.write_config("not = [valid")
    assert run.settings() == (None, "test")
    run.write_metrics("inductive", {"protocol": "inductive", "pickers": {"lm": {"CIDEr": 1.0}}})
    run.write_metrics("other", {"no": "pickers"})
    assert run.metrics_docs() == {"inductive": {"protocol": "inductive", "pickers": {"lm": {"CIDEr": 1.0}}}}
    run.metrics_path("broken").write_text("{")
    with pytest.raises(ValueError, match=r"broken\.json: not valid JSON"):
        run.metrics_docs()


def test_a_run_inside_rays_unpacked_working_directory_is_refused(tmp_path, monkeypatch):
    """`ray job submit --working-dir .` runs the driver in .../runtime_resources/working_dir_files/
    _ray_pkg_<hash>, which Ray deletes: a relative paths.runs_dir would put the run there, lost to any
    resume. Refused in one line before anything is written; $ADJCAP_RUNS (the images set it) moves it."""
    from adjcap.engine.run_plan import default_run_dir

    pkg = tmp_path / "session_1" / "runtime_resources" / "working_dir_files" / "_ray_pkg_0a1b2c3d"
    pkg.mkdir(parents=True)
    monkeypatch.chdir(pkg)
    monkeypatch.delenv("ADJCAP_RUNS", raising=False)
    run = default_run_dir(load_config("demo"))  # paths.runs_dir "runs": relative, inside the package
    with pytest.raises(RunDirError) as got:
        with run.lock():
            pass
    line = str(got.value)
    assert "\n" not in line and f"inside Ray's unpacked working directory {pkg}" in line and "ADJCAP_RUNS" in line
    assert not (pkg / "runs").exists()
    shared = tmp_path / "shared" / "runs"
    monkeypatch.setenv("ADJCAP_RUNS", str(shared))
    run = default_run_dir(load_config("demo"))
    with run.lock():
        pass
    assert run.path.parent == shared and run.path.is_dir()

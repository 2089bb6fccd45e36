"""Faults injected into real `python cli.py run-job demo` drivers on one run directory, in one
sequence (four Ray launches in all, to keep the suite short):

1. driver A starts (split pools: its scorer's own actor is killed); a second job on the same run
   directory is refused at once, naming A's pid and host; after its first feature part a Ray actor of A
   is SIGKILLed (Ray restarts it) and, while the new actor starts, A gets SIGINT: exit 130, one line,
   completed parts kept;
2. driver S resumes and gets SIGTERM after its first new part (a scheduler's stop: SLURM, Kubernetes,
   `kill`): the same one-line stop as Ctrl-C with exit code 143, no Ray stack dump, parts kept;
3. driver C resumes and is SIGKILLed (no chance to clean up) after writing more parts: every process
   of its embedded Ray is gone within 10 s;
4. a part is corrupted and a half-written temp part is left behind; driver D resumes to the end:
   the corrupt part is moved aside and its images recomputed, the temp part removed, only missing
   images are computed, and the run ends with every image exactly once; a truncated image is a counted
   failure in the metrics.

S, C and D kill no named pool's actor: they run one fused pool (one actor process instead of four; the
pools are a speed setting, not part of the features' identity, so they resume A's run as it is).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from adjcap.storage.rundir import RunDir
from adjcap.config import load_config
from adjcap.engine.pipeline import load_models
from adjcap.engine.run_plan import read_records

from .listening import descendants
from .own_world import own_world_settings
from adjcap.jobs.failures import EXIT_FAILED_IMAGES

pytestmark = [pytest.mark.alone, pytest.mark.slow, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 10  # per split: A (~3 parts), S and C (+1 / +2 or a few more: a fused actor is fast once loaded) leave D work
BENCH = "demo"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    """Running (a zombie that nobody reaped yet is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Driver:
    """One `cli.py run-job` subprocess (its own session, so only the signals we send reach it)."""

    def __init__(self, args: list[str], log_dir: Path, name: str):
        self.out = log_dir / f"{name}.out"
        self.err = log_dir / f"{name}.err"
        env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   RAY_USAGE_STATS_ENABLED="0", TOKENIZERS_PARALLELISM="false")
        env.pop("RAY_ADDRESS", None)
        with open(self.out, "wb") as o, open(self.err, "wb") as e:
            # SIGINT back to its default in the driver: a test run started in the background of a
            # non-interactive shell inherits SIGINT ignored, and Python then never raises KeyboardInterrupt
            self.proc = subprocess.Popen([sys.executable, "cli.py", *args], cwd=ROOT, env=env, stdout=o, stderr=e,
                                         start_new_session=True, preexec_fn=_default_sigint)
        self.pid = self.proc.pid
        self.seen: set[int] = set()

    def track(self) -> set[int]:
        """The driver's process tree (Ray's processes included), remembered for the cleanup."""
        if self.proc.poll() is None:
            self.seen |= descendants(self.pid)
        return self.seen

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    def reap(self) -> None:
        """Stop what is left of the processes this test started (by pid)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        for pid in sorted(self.seen - {self.pid}):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _wait_for(cond, timeout: float, what: str, driver: Driver | None = None, step: float = 0.2):
    end = time.time() + timeout
    while time.time() < end:
        if driver is not None:
            driver.track()
            if driver.proc.poll() is not None and not cond():
                raise AssertionError(f"{what}: the driver exited ({driver.proc.returncode}) first:\n"
                                     f"{driver.stderr()[-3000:]}")
        v = cond()
        if v:
            return v
        time.sleep(step)
    raise AssertionError(f"timed out waiting for {what}" + (f":\n{driver.stderr()[-3000:]}" if driver else ""))


def _part_ids(run: RunDir) -> dict[str, list[str]]:
    """split -> image ids over every readable part (duplicates kept, to be counted)."""
    out: dict[str, list[str]] = {}
    for split in ("val", "test"):
        ids: list[str] = []
        for p in run.parts(BENCH, split):
            try:
                ids += pq.read_table(p, columns=["image_id"]).column("image_id").to_pylist()
            except Exception:  # noqa: BLE001 - a part being replaced or corrupted on purpose
                pass
        out[split] = ids
    return out


def _n_parts(run: RunDir) -> int:
    return sum(len(run.parts(BENCH, s)) for s in ("val", "test"))


def _one_line_error(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith(("error:", "interrupted:"))]
    assert len(errors) == 1, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    return errors[0]


@pytest.fixture(scope="module")
def scenario(demo_cfg, tmp_path_factory):
    base = tmp_path_factory.mktemp("jobfaults")
    world = base / "world"
    # cache.share_stages=false: the pools compute every stage (none taken from what other modules stored)
    sets = own_world_settings(demo_cfg, world)
    cfg = load_config("demo", sets + [f"limit={LIMIT}"]).resolved()
    records = read_records(cfg)
    load_models(cfg)  # the corpus index, built here once, so the drivers start no encode job
    # a truncated JPEG/PNG among the test images: it must become a counted failure, not a crash
    victim = records["test"][2]
    data = Path(victim.image_path).read_bytes()
    Path(victim.image_path).write_bytes(data[: len(data) // 3])
    run_dir = base / "run"
    args = ["run-job", BENCH, "--workers", "1", "--limit", str(LIMIT), "--run-dir", str(run_dir)]
    for s in sets:
        args += ["--set", s]
    # split pools for A (auto would fuse them on this GPU-less machine): the scorer's own actor is killed
    # below; S, C and D kill no pool's actor: one fused actor each
    return {"cfg": cfg, "records": records, "victim": victim.image_id, "run": RunDir(run_dir),
            "args": args + ["--set", "ray.pools=split"], "fused_args": args + ["--set", "ray.pools=fused"],
            "logs": base, "events": {}}


@pytest.fixture(scope="module")
def interrupted(scenario):
    """Driver A: refused second job, an actor killed, then SIGINT."""
    run, ev = scenario["run"], scenario["events"]
    a = Driver(scenario["args"], scenario["logs"], "A")
    try:
        _wait_for(lambda: run.lock_path.exists() and run.lock_path.read_text().strip(), 240, "A's run lock", a)
        ev["a_pid"] = a.pid
        b = Driver(scenario["args"], scenario["logs"], "B")
        ev["b_rc"] = b.wait(180)
        ev["b_err"] = b.stderr()

        def scorer_actor():
            return [p for p in a.track() if "ScorerActor" in _cmdline(p) and p != a.pid]

        # past model loading (a part means every pool has processed a batch), kill the scorer: the last
        # pool, so it surely has images left (an earlier pool may already have run through every image
        # while the scorer, the slowest, works on: then its death needs no restart and tests nothing)
        _wait_for(lambda: _n_parts(run) >= 1, 600, "A's first feature part", a)
        victims = _wait_for(scorer_actor, 60, "a scorer actor process", a)
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        ev["killed_actor"] = victims
        # Ray starts a new scorer actor; SIGINT while it loads, so the job is surely mid-way. (Waiting
        # for parts instead raced the job's end on a quiet machine: Ray Data keeps output order, so the
        # rows after the killed block arrive in one burst when it is redone, and A finished first.)
        _wait_for(lambda: [p for p in scorer_actor() if p not in victims], 300, "A's restarted scorer", a)
        os.kill(a.pid, signal.SIGINT)
        ev["a_rc"] = a.wait(180)
        ev["a_err"] = a.stderr()
        ev["after_a"] = _part_ids(run)
    finally:
        a.reap()
    return scenario


@contextlib.contextmanager
def _resumed(scenario, name: str, new_parts: int) -> Iterator[Driver]:
    """Driver ``name`` resuming the run on one fused pool, given once it wrote ``new_parts`` more parts;
    what is left of its processes is stopped after."""
    run = scenario["run"]
    before = _n_parts(run)
    d = Driver(scenario["fused_args"], scenario["logs"], name)
    try:
        _wait_for(lambda: _n_parts(run) >= before + new_parts, 400, f"{name}'s new parts", d)
        yield d
    finally:
        d.reap()


@pytest.fixture(scope="module")
def terminated(interrupted):
    """Driver S: resumes, SIGTERM after its first new part (Ray is up and the pool has processed a batch)."""
    run, ev = interrupted["run"], interrupted["events"]
    with _resumed(interrupted, "S", 1) as s:
        s.track()
        s.proc.send_signal(signal.SIGTERM)
        ev["s_rc"] = s.wait(180)
    ev["s_err"] = s.stderr()
    ev["after_s"] = _part_ids(run)
    return interrupted


@pytest.fixture(scope="module")
def killed(terminated):
    """Driver C: resumes, SIGKILLed after more parts."""
    run, ev = terminated["run"], terminated["events"]
    with _resumed(terminated, "C", 2) as c:
        tree = c.track() - {c.pid}  # its embedded Ray: servers, agents, workers (and the reaper)
        os.kill(c.pid, signal.SIGKILL)
        ev["c_rc"] = c.wait(60)
        end = time.time() + 10
        while (alive := {p for p in tree if _alive(p)}) and time.time() < end:
            time.sleep(0.2)
        ev["c_tree"], ev["c_left"] = len(tree), {p: _cmdline(p) for p in alive}
    ev["after_c"] = _part_ids(run)
    return terminated


@pytest.fixture(scope="module")
def finished(killed):
    """A corrupt part and a leftover temp part, then driver D to the end."""
    run, ev = killed["run"], killed["events"]
    victim = run.parts(BENCH, "val")[0]
    ev["corrupt_ids"] = pq.read_table(victim, columns=["image_id"]).column("image_id").to_pylist()
    victim.write_bytes(b"PAR1 not really a parquet file")
    ev["corrupt_name"] = victim.name
    tmp = run.features_dir(BENCH, "test") / ".part-00000000000000000001-h-1-deadbeef.parquet.x1y2z3.tmp"
    tmp.parent.mkdir(parents=True, exist_ok=True)
    tmp.write_bytes(b"PAR1 half")  # what a killed writer may leave: a temp name, never read as a part
    ev["leftover"] = tmp
    ev["have_before_d"] = {s: set(ids) - (set(ev["corrupt_ids"]) if s == "val" else set())
                           for s, ids in _part_ids(run).items()}
    d = Driver(killed["fused_args"], killed["logs"], "D")
    try:
        ev["d_rc"] = d.wait(900)
    finally:
        d.reap()
    ev["d_out"], ev["d_err"] = d.stdout(), d.stderr()
    return killed


def test_second_job_on_the_run_dir_is_refused_naming_the_holder(interrupted):
    ev = interrupted["events"]
    assert ev["b_rc"] != 0
    line = _one_line_error(ev["b_err"])
    assert f"is in use by pid {ev['a_pid']} on host {socket.gethostname()}" in line, line


def test_sigint_stops_the_driver_with_one_line_and_keeps_parts(interrupted):
    ev = interrupted["events"]
    assert ev["a_rc"] == 130, ev["a_err"][-3000:]
    line = _one_line_error(ev["a_err"])
    assert line.startswith("interrupted:") and "resume" in line
    ids = ev["after_a"]["val"] + ev["after_a"]["test"]
    assert ids and len(ids) == len(set(ids))  # kept parts, no image twice (even with an actor killed)


def test_sigterm_is_the_same_clean_stop_with_exit_143(terminated):
    ev = terminated["events"]
    err = ev["s_err"]
    assert ev["s_rc"] == 143, err[-3000:]
    line = _one_line_error(err)
    assert line.startswith("interrupted:") and "resume" in line
    assert "Aborted" not in err and "SIGTERM" not in err and "Fatal Python error" not in err, err[-3000:]
    for split, ids in ev["after_s"].items():
        assert len(ids) == len(set(ids)), split
        assert set(ev["after_a"][split]) <= set(ids)  # S only added
    n = sum(len(ids) for ids in ev["after_s"].values())
    assert sum(len(ids) for ids in ev["after_a"].values()) < n < 2 * LIMIT  # S wrote a part and stopped mid-job


def test_sigkill_keeps_complete_parts_only(killed):
    ev = killed["events"]
    assert ev["c_rc"] == -signal.SIGKILL
    for split, ids in ev["after_c"].items():
        assert len(ids) == len(set(ids)), split
        assert set(ev["after_s"][split]) <= set(ids)  # C only added


def test_the_embedded_ray_does_not_outlive_a_killed_driver(killed):
    """Every process of C's embedded Ray is gone within 10 s of C's SIGKILL (jobs/ray_guards.py)."""
    ev = killed["events"]
    assert ev["c_tree"] >= 5  # gcs, raylet, agents, pool workers, the reaper: there was a Ray to end
    assert not ev["c_left"], ev["c_left"]


def test_resume_after_everything_has_every_image_exactly_once(finished):
    ev, run, records = finished["events"], finished["run"], finished["records"]
    # the world's one truncated image (the victim) failed: the job still writes everything, then says so
    # in one line and exits EXIT_FAILED_IMAGES (jobs/failures.py)
    assert ev["d_rc"] == EXIT_FAILED_IMAGES, ev["d_err"][-4000:]
    assert sum(f"1 of {2 * LIMIT} images failed; first: " in ln for ln in ev["d_err"].splitlines()) == 1, ev["d_err"][-4000:]
    # the corrupt part was moved aside (kept for inspection) and said so
    corrupt = run.features_dir(BENCH, "val") / (ev["corrupt_name"] + ".corrupt")
    assert corrupt.exists() and "moved to" in ev["d_err"] and ev["corrupt_name"] in ev["d_err"]
    assert not ev["leftover"].exists()  # the temp part a killed writer left was removed
    assert "already written" in ev["d_out"]
    final = _part_ids(run)
    summary = run.summary()["splits"]
    for split, recs in records.items():
        want = {r.image_id for r in recs}
        ids = final[split]
        assert len(ids) == len(set(ids)) == len(want) == LIMIT, split  # exactly once, nothing lost
        assert set(ids) == want
        # only what was missing (never written, or in the corrupt part) was computed again
        missing = want - ev["have_before_d"][split]
        assert summary[split]["done"] + summary[split]["failed"] == len(missing), (split, summary[split])
        assert summary[split]["skipped"] == LIMIT - len(missing)
    assert set(ev["corrupt_ids"]) <= set(final["val"])
    # the truncated image: one error row, counted (not scored) in the metrics
    rows = {r["image_id"]: r for r in run.read_features(BENCH, "test").to_pylist()}
    assert rows[finished["victim"]]["error"].startswith("decode:")
    assert sum(1 for r in rows.values() if r["error"]) == 1
    metrics = json.loads(run.metrics_path(finished["cfg"].rerank.protocol).read_text())
    assert metrics["failed_images"]["count"] == 1 and metrics["failed_images"]["ids"] == [finished["victim"]]
    assert run.report_md.exists()


def test_the_killed_actor_was_really_killed(interrupted):
    assert interrupted["events"]["killed_actor"]

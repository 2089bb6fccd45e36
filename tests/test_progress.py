"""adjcap's own progress lines, the quiet console's Ray settings and the written-files summary (no Ray started)."""

import io
import logging
import os
import time

from adjcap.engine.cluster_plan import PoolPlan
from adjcap.config import load_config
from adjcap.storage.rundir import RunDir
from adjcap.jobs.progress_display import Tally, Lines, duration
from adjcap.jobs.ray_session import init_options, quiet_console
from adjcap.jobs.run import written_since
from adjcap.jobs.extract_features import stream_stages


def test_line_counts_rate_and_eta_from_the_last_stage():
    t = Tally(["decode", "retrieve", "score"], total=10, done={"decode": 10, "retrieve": 6, "score": 4},
              failed={"retrieve": 1}, elapsed=30.0, first_done_at=10.0, first_done=2)
    assert t.remaining == 6 and t.rate() == 0.1 and t.eta() == 60.0
    assert t.line("features", "images") == ("features: decode 10/10, retrieve 6/10 (1 failed), score 4/10 | "
                                            "0.10 images/s | ETA 1m00s | 30s elapsed")
    # nothing through the last stage yet: no rate, no ETA; all through: ETA 0
    assert Tally(["score"], 5, done={}).eta() is None
    assert Tally(["score"], 5, done={"score": 5}).eta() == 0.0
    assert duration(3725) == "1h02m" and duration(None) == "?"
    # a small job whose images all came through in one batch: the rate over the whole time
    once = Tally(["score"], 6, done={"score": 6}, elapsed=30.0, first_done_at=30.0, first_done=6)
    assert once.rate() == 0.2


def test_lines_every_interval_and_the_final_one():
    out = io.StringIO()
    view = Lines(out, interval=10)
    t = Tally(["score"], 4)
    for elapsed in (0.5, 5, 10.5, 12, 21):
        t.elapsed = elapsed
        view.show(t, "features", "images")
    t.done = {"score": 4}
    view.show(t, "features", "images", final=True)
    lines = out.getvalue().splitlines()
    assert len(lines) == 3 and lines[-1].startswith("features: score 4/4 ")


def test_quiet_console_and_verbose():
    from ray.data import DataContext

    ctx = DataContext.get_current()
    data_console = [h for h in logging.getLogger("ray.data").handlers
                    if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)]
    try:
        quiet_console(False)
        assert not (ctx.enable_progress_bars or ctx.enable_operator_progress_bars or ctx.print_on_execution_start)
        assert logging.getLogger("ray").level == logging.WARNING
        assert data_console and all(h.level == logging.WARNING for h in data_console)
        assert logging.getLogger("ray.data._internal.progress").level == logging.ERROR  # "Progress bars disabled"
        quiet_console(True)
        assert ctx.enable_progress_bars and ctx.print_on_execution_start
        assert all(h.level == logging.INFO for h in data_console)
    finally:
        quiet_console(False)
    cfg = load_config("demo")
    assert init_options(cfg) == {"logging_level": logging.WARNING, "log_to_driver": False}
    verbose = load_config("demo", ["ray.verbose=true"])
    assert init_options(verbose) == {"logging_level": logging.INFO, "log_to_driver": True}


def test_written_lists_exactly_what_changed(tmp_path):
    rd = RunDir(tmp_path / "run")
    rd.path.mkdir()
    old = rd.path / "report.md"
    old.write_text("from an earlier run")
    (rd.path / "metrics").mkdir()
    (rd.path / "metrics" / "inductive.json").write_text("{}")
    past = time.time() - 3600
    for p in (old, rd.path / "metrics" / "inductive.json"):
        os.utime(p, (past, past))
    started = time.time_ns()
    (rd.path / "features" / "demo-test").mkdir(parents=True)
    (rd.path / "features" / "demo-test" / "part-0.parquet").write_bytes(b"x")
    (rd.path / "config.toml").write_text("x")
    rd.lock_path.write_text("pid")
    assert written_since(rd, started) == ["config.toml", "features/"]


def test_stream_stages_follow_the_pools():
    cfg = PoolPlan.of(load_config("demo").resolved())
    assert stream_stages(cfg, 0) == ["decode", "retrieve", "verify", "caption", "score"]
    assert stream_stages(cfg, 2) == ["decode", "caption", "score"]

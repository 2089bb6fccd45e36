"""The console of a demo job (`adjcap run-job demo` in a subprocess, stdout and stderr together): adjcap's
progress and summary, no Ray INFO lines, no issue-detector memory warnings, no open_clip "initialized
randomly"; `--verbose` brings Ray's own output back (shown on `adjcap encode-corpus`, the smallest Ray job:
every command connects to Ray through the same session, jobs/ray_session.py)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
RAY_INFO = re.compile(r"^\S+ \S+\s+INFO \S+\.py:\d+ -- ", re.M)  # Ray's log format at INFO
ISSUE_DETECTOR = re.compile(r"configured\s+logical\s+memory|configured \S+ MiB")
RANDOM_INIT = "initialized randomly"


def _cli(demo_cfg, *args: str) -> str:
    """An adjcap command on the session's demo world without the dashboard; the console it printed."""
    cmd = [sys.executable, str(ROOT / "cli.py"), *args, "--set", f"paths.cache_dir={demo_cfg.paths.cache_dir}",
           "--set", "ray.include_dashboard=false"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    res = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stdout
    return res.stdout


def test_quiet_console_by_default_and_ray_output_with_verbose(demo_cfg, tmp_path):
    # `adjcap run-job demo` on 2 images per split, every stage computed
    quiet = _cli(demo_cfg, "run-job", "demo", "--limit", "2", "--run-dir", str(tmp_path / "quiet"), "--no-evaluate",
                 "--set", "cache.share_stages=false")
    assert not RAY_INFO.search(quiet), quiet
    assert not ISSUE_DETECTOR.search(quiet), quiet
    assert RANDOM_INIT not in quiet and "logging_progress" not in quiet and "Progress bars disabled" not in quiet, quiet
    # adjcap's own progress (a pipe: lines) and a summary listing exactly what was written
    assert re.search(r"^features: decode 4/4, retrieve 4/4, verify 4/4, caption 4/4, score 4/4 \|", quiet, re.M), quiet
    written = re.search(r"^written: (.*) in$", quiet, re.M)
    assert written, quiet
    listed = written[1].split(", ")
    on_disk = sorted(p.name + ("/" if p.is_dir() else "") for p in (tmp_path / "quiet").iterdir()
                     if p.name != "run.lock")
    assert sorted(listed) == on_disk and "metrics/" not in listed and "report.md" not in listed
    assert quiet.strip().splitlines()[-1] == str(tmp_path / "quiet")

    # the demo corpus encoded into a new index: one Ray Data job with one actor
    verbose = _cli(demo_cfg, "encode-corpus", "--preset", "demo", "--benchmark", "demo", "--verbose",
                   "--set", f"retrieval.index_dir={tmp_path / 'index'}")
    assert RAY_INFO.search(verbose), verbose  # Ray's INFO lines (Ray Data's execution plan, progress) are back
    assert "Execution plan of Dataset" in verbose or "Running Dataset" in verbose, verbose

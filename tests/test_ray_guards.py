"""The embedded Ray's reaper (adjcap.jobs.ray_guards), without Ray: a process holding a file open in a
stand-in session directory is what the reaper ends once the driver closes its lifeline, and closing
the lifeline returns only after the reaper is done (the driver starts Java for the metrics next: forked
with the driver's open files, it must never be scanned by a reaper still at work)."""

import subprocess
from pathlib import Path

from adjcap.jobs.ray_guards import reap_with_driver

ROOT = Path(__file__).resolve().parents[1]


def test_closing_the_lifeline_returns_once_the_session_is_reaped(tmp_path):
    with open(tmp_path / "worker.log", "wb") as log:  # a Ray process keeps its log open in the session
        worker = subprocess.Popen(["sleep", "60"], stdout=log, stdin=subprocess.DEVNULL)
    other = subprocess.Popen(["sleep", "60"], stdin=subprocess.DEVNULL)  # nothing open in the session
    try:
        lifeline = reap_with_driver(str(tmp_path), ROOT)
        assert worker.poll() is None  # the reaper waits for the driver
        lifeline.close()
        assert worker.poll() == -9  # reaped before close() returned
        assert other.poll() is None
    finally:
        for p in (worker, other):
            p.kill()
            p.wait()

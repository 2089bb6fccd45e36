"""What a quiet adjcap console (the default) shows and what it must not (tests/test_console.py,
tests/test_demo_effect.py): adjcap's progress and summary, no Ray INFO lines, no issue-detector memory
warnings, no open_clip "initialized randomly"."""

import re
from pathlib import Path

RAY_INFO = re.compile(r"^\S+ \S+\s+INFO \S+\.py:\d+ -- ", re.M)  # Ray's log format at INFO
ISSUE_DETECTOR = re.compile(r"configured\s+logical\s+memory|configured \S+ MiB")
RANDOM_INIT = "initialized randomly"
PROGRESS = re.compile(r"^features: decode (\d+)/\1, retrieve \1/\1, verify \1/\1, caption \1/\1, score \1/\1 \|", re.M)


def assert_quiet_console(out: str, run_dir: Path, images: int) -> list[str]:
    """The console of a job on ``images`` images into ``run_dir``: nothing of Ray's, adjcap's own
    progress (a pipe: lines), a summary listing exactly what was written, the run directory last.
    Returns the summary's list."""
    assert not RAY_INFO.search(out), out
    assert not ISSUE_DETECTOR.search(out), out
    assert RANDOM_INIT not in out and "logging_progress" not in out and "Progress bars disabled" not in out, out
    done = PROGRESS.search(out)
    assert done and int(done[1]) == images, out
    written = re.search(r"^written: (.*) in$", out, re.M)
    assert written, out
    listed = written[1].split(", ")
    on_disk = sorted(p.name + ("/" if p.is_dir() else "") for p in run_dir.iterdir() if p.name != "run.lock")
    assert sorted(listed) == on_disk, (listed, on_disk)
    assert out.strip().splitlines()[-1] == str(run_dir)
    return listed

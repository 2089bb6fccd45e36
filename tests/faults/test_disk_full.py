"""Disk full: a size-limited file system (a small tmpfs when we may mount one, else a per-process
file-size limit, RLIMIT_FSIZE, in a child process) -> a one-line error and nothing half-written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from adjcap.storage.rundir import RunDir

pytestmark = [pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
SIZE = 256 * 1024


@pytest.fixture
def small_fs(tmp_path):
    """(directory with about SIZE bytes of room, how the limit is applied: 'tmpfs' or 'rlimit')."""
    d = tmp_path / "small"
    d.mkdir()
    if os.geteuid() == 0:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE},mode=0700", "tmpfs", str(d)],
                           capture_output=True)
        if r.returncode == 0:
            try:
                yield d, "tmpfs"
            finally:
                subprocess.run(["umount", "-l", str(d)], capture_output=True)
            return
    yield d, "rlimit"


def _child(code: str, how: str, *args: str) -> subprocess.CompletedProcess:
    """Run python code in a child; with 'rlimit' every file it writes is capped at SIZE bytes."""
    pre = ""
    if how == "rlimit":
        pre = ("import resource, signal; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
               f"resource.setrlimit(resource.RLIMIT_FSIZE, ({SIZE}, {SIZE}))\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return subprocess.run([sys.executable, "-c", pre + code, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=240)


WRITE_PARTS = r"""
import sys
import numpy as np, pyarrow as pa
from adjcap.storage.rundir import RunDir
run = RunDir(sys.argv[1])
run.write_part("demo", "test", pa.table({"image_id": ["a", "b"], "x": [1.0, 2.0]}))
rng = np.random.default_rng(0)
big = pa.table({"image_id": [f"i{k}" for k in range(200_000)], "x": rng.random(200_000)})
try:
    run.write_part("demo", "test", big)
except OSError as e:
    print("OSERROR", e.errno)
"""


def test_a_full_disk_leaves_complete_parts_only(small_fs):
    d, how = small_fs
    r = _child(WRITE_PARTS, how, str(d / "run"))
    assert "OSERROR" in r.stdout, (how, r.stdout, r.stderr[-2000:])
    run = RunDir(d / "run")
    files = sorted(p.name for p in run.features_dir("demo", "test").iterdir())
    assert len(files) == 1 and files[0].startswith("part-"), files  # the small part; no temp left over
    assert run.done_ids("demo", "test") == {"a", "b"}


@pytest.mark.slow  # a whole `adjcap evaluate` in a child (its Java tokeniser and METEOR): make test only
def test_evaluate_onto_a_full_disk_is_one_line_and_writes_nothing(small_fs, small_coco):
    d, how = small_fs
    pred, refs, _ = small_coco
    out = d / "metrics.json"
    if how == "tmpfs":  # leave almost no room
        filler = d / "filler"
        with open(filler, "wb") as f:
            try:
                f.write(b"\0" * SIZE)
            except OSError:
                pass
    code = ("import sys; sys.argv = ['adjcap'] + sys.argv[1:]\n"
            "from cli import main\nmain()\n")
    r = _child(code, how, "evaluate", "--no-spice", "--predictions", str(pred), "--references", str(refs),
               "--out", str(out))
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2, (r.stdout[-1000:], r.stderr[-3000:])
    assert len(err) == 1 and err[0].startswith("error:") and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert "no space left" in err[0], err[0]
    if how == "tmpfs":  # (under a file-size limit, the first file over it may be another one)
        assert f"writing to {out.parent} " in err[0], err[0]
    assert not out.exists() and not [p for p in d.iterdir() if p.name.endswith(".tmp")]

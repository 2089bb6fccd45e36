"""The wheel as a user installs it: built from the repository's tracked files (links kept as links,
as a fresh clone has them), installed with pip into a new virtual environment whose only other
packages are this environment's dependencies (a .pth line; the editable adjcap's finder is not loaded)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def tracked_copy(dst: Path) -> Path:
    """The files git tracks, copied as a clone would check them out (links stay links)."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for rel in filter(None, files.decode().split("\0")):
        src, out = ROOT / rel, dst / rel
        if not src.exists() and not src.is_symlink():
            continue  # deleted in the working tree, not yet committed
        out.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            out.symlink_to(os.readlink(src))
        else:
            shutil.copy2(src, out)
    return dst


def build_wheel(src: Path, out: Path) -> tuple[Path, str]:
    """``pip wheel`` of a source tree (no build isolation: the environment's setuptools) -> (wheel, log)."""
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v",
                          "-w", str(out), str(src)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (whl,) = out.glob("adjcap-*.whl")
    return whl, res.stdout + res.stderr


def new_venv(where: Path, wheel: Path) -> Path:
    """A new venv with ``wheel`` installed by pip; returns its bin/ folder."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    py = where / "bin" / "python"
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    Path(site, "adjcap-test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", str(wheel)],
                   check=True, capture_output=True, timeout=300)
    return where / "bin"

"""One layout (docs/architecture.md): the wheel holds the adjcap package only, the application layer
(jobs/, actors/, cli.py) inside it as adjcap.jobs, adjcap.actors and adjcap.cli with the very files of
the checkout (nothing rewritten); the console script is adjcap.cli:main; the license is an SPDX
expression; the editable install maps nothing but adjcap. The installed wheel captioning images
through Ray is tests/test_caption_folder.py."""

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from wheel_venv import ROOT, build_wheel, tracked_copy

APP = {"jobs": "adjcap/jobs", "actors": "adjcap/actors"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> tuple[zipfile.ZipFile, str]:
    src = tracked_copy(tmp_path_factory.mktemp("src"))
    whl, log = build_wheel(src, tmp_path_factory.mktemp("wheel"))
    return zipfile.ZipFile(whl), log


def test_wheel_has_only_the_adjcap_namespace(wheel):
    zf, _ = wheel
    names = zf.namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"adjcap", next(t for t in tops if t.endswith(".dist-info"))}, tops
    info = next(t for t in tops if t.endswith(".dist-info"))
    assert zf.read(f"{info}/top_level.txt").decode().split() == ["adjcap"]
    for top, installed in APP.items():  # every module of the application layer, as it is in the checkout
        for f in (ROOT / top).rglob("*.py"):
            assert zf.read(f"{installed}/{f.relative_to(ROOT / top).as_posix()}") == f.read_bytes(), f
    assert zf.read("adjcap/cli.py") == (ROOT / "cli.py").read_bytes() and "adjcap/__main__.py" in names
    for data in ("adjcap/presets/headline.toml", "adjcap/presets/demo.toml", "adjcap/benchmarks.toml",
                 "adjcap/reproduce/tables.toml"):
        assert data in names


def test_entry_point_and_spdx_license_without_deprecation(wheel):
    zf, log = wheel
    info = next(n.split("/")[0] for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
    eps = zf.read(f"{info}/entry_points.txt").decode()
    assert "adjcap = adjcap.cli:main" in eps
    meta = zf.read(f"{info}/METADATA").decode()
    assert "License-Expression: MIT" in meta and "License-File: LICENSE" in meta
    assert f"{info}/licenses/LICENSE" in zf.namelist()
    assert "deprecat" not in log.lower(), [ln for ln in log.splitlines() if "deprecat" in ln.lower()]
    assert "is absent from the `packages` configuration" not in log


def test_the_editable_install_maps_adjcap_only(tmp_path):
    """Outside the checkout the editable install (make's .venv) imports adjcap.jobs, and no
    ``jobs``, ``actors`` or ``cli``."""
    code = ("import importlib, adjcap.jobs.run, adjcap.actors.pool, adjcap.cli\n"
            "for name in ('jobs', 'actors', 'cli'):\n"
            "    try:\n        importlib.import_module(name)\n    except ModuleNotFoundError:\n        continue\n"
            "    raise SystemExit(name + ' imports')\n"
            "print(adjcap.jobs.run.__file__)")
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    assert Path(res.stdout.strip()) == ROOT / "adjcap" / "jobs" / "run.py"


def test_the_sdist_holds_each_application_file_once_and_builds_the_same_wheel(tmp_path, wheel):
    """jobs/, actors/ and cli.py are in the sdist once, as adjcap/jobs, adjcap/actors and adjcap/cli.py
    (MANIFEST.in), byte for byte the checkout's; a wheel built from the unpacked sdist holds the same
    files as the checkout's wheel."""
    src = tracked_copy(tmp_path / "src")
    res = subprocess.run([sys.executable, "-c", "import sys; from setuptools import build_meta as b; "
                          "print(b.build_sdist(sys.argv[1]))", str(tmp_path / "dist")], cwd=src,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    with tarfile.open(tmp_path / "dist" / res.stdout.split()[-1]) as tar:
        members = {m.name.split("/", 1)[1]: m for m in tar.getmembers() if "/" in m.name and m.isfile()}
        app = [(f, f"{APP[top]}/{f.relative_to(ROOT / top).as_posix()}") for top in APP
               for f in (ROOT / top).rglob("*.py")] + [(ROOT / "cli.py", "adjcap/cli.py")]
        assert len(app) > 20
        for f, name in app:
            assert tar.extractfile(members[name]).read() == f.read_bytes(), name
        tar.extractall(tmp_path / "unpacked", filter="data")
    for name in members:  # not a second time at the root
        assert name.split("/")[0] not in ("jobs", "actors", "cli.py"), name
    (unpacked,) = (tmp_path / "unpacked").iterdir()
    whl, _ = build_wheel(unpacked, tmp_path / "wheel")
    checkout_wheel, _ = wheel
    again = zipfile.ZipFile(whl)
    code = [n for n in checkout_wheel.namelist() if n.startswith("adjcap/") and not n.endswith("/")]
    assert sorted(code) == sorted(n for n in again.namelist() if n.startswith("adjcap/") and not n.endswith("/"))
    assert all(again.read(n) == checkout_wheel.read(n) for n in code)


def test_requires_python_is_what_runs():
    """``requires-python`` names the oldest Python the code runs on: every tracked source file parses at
    that version's grammar, and the standard library's tomllib (adjcap/config/) needs 3.11."""
    import ast
    import re
    import tomllib

    spec = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    low = tuple(int(x) for x in re.fullmatch(r">=(\d+)\.(\d+)", spec).groups())
    assert sys.version_info[:2] >= low  # this suite runs on a supported version
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    for rel in files.stdout.split():
        if (ROOT / rel).is_file():
            ast.parse((ROOT / rel).read_text(), filename=rel, feature_version=low)
    assert "import tomllib" in (ROOT / "adjcap" / "config" / "loading.py").read_text() and low >= (3, 11)


def test_the_workers_code_root_is_safe_under_resolve():
    """``ROOT`` (the folder the Ray workers import adjcap from) holds this very adjcap, resolved or not,
    though adjcap/jobs is a link to the repository's jobs/."""
    from adjcap.jobs import ray_session

    root = ray_session.ROOT
    assert root == root.resolve()
    assert (root / "adjcap" / "jobs" / "ray_session.py").resolve() == Path(ray_session.__file__).resolve()
    assert (root / "adjcap" / "__init__.py").is_file()

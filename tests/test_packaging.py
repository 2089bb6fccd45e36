"""The wheel installs nothing under a generic top-level name: jobs/, actors/ and cli.py go under the
adjcap namespace (adjcap._jobs, adjcap._actors, adjcap._cli) with their imports of each other
rewritten; the console script is adjcap.__main__:main; the license is an SPDX expression. Builds the
wheel only (no install), from a copy of the sources, with the environment's setuptools."""

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "LICENSE", "README.md", "cli.py", "adjcap", "jobs", "actors")
APP = {"jobs": "adjcap/_jobs", "actors": "adjcap/_actors"}
ENTRIES = ("adjcap/__main__.py", "adjcap/api.py")  # try adjcap._cli / adjcap._jobs first (tests/test_imports.py)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> tuple[zipfile.ZipFile, str]:
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        p = ROOT / name
        if p.is_dir():
            shutil.copytree(p, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(p, src / name)
    out = tmp_path_factory.mktemp("wheel")
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v",
                          "-w", str(out), str(src)], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (whl,) = out.glob("adjcap-*.whl")
    return zipfile.ZipFile(whl), res.stdout + res.stderr


def test_wheel_has_only_the_adjcap_namespace(wheel):
    zf, _ = wheel
    names = zf.namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"adjcap", next(t for t in tops if t.endswith(".dist-info"))}, tops
    info = next(t for t in tops if t.endswith(".dist-info"))
    assert zf.read(f"{info}/top_level.txt").decode().split() == ["adjcap"]
    for top, installed in APP.items():  # every module of the application layer, under adjcap
        for f in (ROOT / top).rglob("*.py"):
            assert f"{installed}/{f.relative_to(ROOT / top).as_posix()}" in names, f
    assert "adjcap/_cli.py" in names and "adjcap/__main__.py" in names
    for data in ("adjcap/presets/headline.toml", "adjcap/presets/demo.toml", "adjcap/benchmarks.toml",
                 "adjcap/reproduce/tables.toml"):
        assert data in names


def test_installed_application_layer_imports_no_generic_name(wheel):
    zf, _ = wheel
    bad = []
    for n in zf.namelist():
        if not n.endswith(".py"):
            continue
        for node in ast.walk(ast.parse(zf.read(n).decode(), filename=n)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
            bad += [f"{n}: {m}" for m in mods if m.split(".")[0] in ("jobs", "actors", "cli")
                    and n not in ENTRIES]  # the entry points' checkout fallback, not reached when installed
    assert not bad, "\n".join(bad)
    run = zf.read("adjcap/_jobs/run.py").decode()
    assert "from adjcap._jobs import evaluate, fit," in run and "from adjcap._jobs.ray_session import ray_session" in run
    assert "from adjcap._actors.retriever import RetrieverActor" in zf.read("adjcap/_jobs/run_benchmark.py").decode()
    assert "from adjcap._jobs import" in zf.read("adjcap/_cli.py").decode()


def test_entry_point_and_spdx_license_without_deprecation(wheel):
    zf, log = wheel
    info = next(n.split("/")[0] for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
    eps = zf.read(f"{info}/entry_points.txt").decode()
    assert "adjcap = adjcap.__main__:main" in eps
    meta = zf.read(f"{info}/METADATA").decode()
    assert "License-Expression: MIT" in meta and "License-File: LICENSE" in meta
    assert f"{info}/licenses/LICENSE" in zf.namelist()
    assert "deprecat" not in log.lower(), [ln for ln in log.splitlines() if "deprecat" in ln.lower()]
    assert "is absent from the `packages` configuration" not in log

"""Where the repository's folders go when adjcap is installed (the rest is in pyproject.toml).

The repository keeps the application layer at its root: ``jobs/``, ``actors/`` and ``cli.py`` import
each other as ``jobs``, ``actors`` and ``cli``. Those are generic names, so a wheel installs them under
the adjcap namespace instead, as ``adjcap._jobs``, ``adjcap._actors`` and ``adjcap._cli``, with their
imports of each other rewritten to the new names at build time (the way pip's vendored packages are
rewritten to ``pip._vendor.*``). Nothing is installed under a generic top-level name.

An editable install (``pip install -e .``: a source checkout, the Makefile's ``.venv``) maps the
checkout as it is, ``jobs``, ``actors`` and ``cli`` included, so the repository and its tests import
them by their own names. ``adjcap/__main__.py`` (the console script) and ``adjcap/api.py`` find the
application layer in either layout.
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

from setuptools import find_namespace_packages, find_packages, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
APP = {"jobs": "adjcap._jobs", "actors": "adjcap._actors", "cli": "adjcap._cli"}  # repository name -> installed
_FROM = re.compile(r"^(?P<indent>[ \t]*)from (?P<name>" + "|".join(APP) + r")(?P<rest>(\.\w+)*) import ", re.M)
_IMPORT = re.compile(r"^[ \t]*import (" + "|".join(APP) + r")\b", re.M)


def rewrite_imports(text: str, where: str) -> str:
    """``from jobs.x import y`` -> ``from adjcap._jobs.x import y`` (and actors, cli); a bare
    ``import jobs`` is refused (it would bind a different name)."""
    bare = _IMPORT.search(text)
    if bare:
        raise SystemExit(f"{where}: 'import {bare.group(1)}' cannot be installed under adjcap; "
                         f"write 'from {bare.group(1)} import ...'")
    return _FROM.sub(lambda m: f"{m['indent']}from {APP[m['name']]}{m['rest']} import ", text)


class BuildPy(build_py):
    """The wheel's build: the application layer goes under adjcap, its imports rewritten."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        lib = Path(self.build_lib)
        shutil.copyfile(ROOT / "cli.py", lib / "adjcap" / "_cli.py")
        for name in APP:
            installed = APP[name].replace(".", "/")
            files = [lib / f"{installed}.py"] if name == "cli" else sorted((lib / installed).rglob("*.py"))
            for f in files:
                f.write_text(rewrite_imports(f.read_text(encoding="utf-8"), str(f.relative_to(lib))), encoding="utf-8")


EDITABLE = "editable_wheel" in sys.argv  # PEP 660 editable install: the checkout as it is

if EDITABLE:
    layout = {"packages": find_namespace_packages(include=["adjcap", "adjcap.*", "actors", "actors.*", "jobs", "jobs.*"],
                                                  exclude=["*.__pycache__"]),
              "py_modules": ["cli"]}
else:
    layout = {
        "packages": [*find_namespace_packages(include=["adjcap", "adjcap.*"], exclude=["*.__pycache__"]),
                     *(APP[top] + p[len(top):] for top in ("jobs", "actors")
                       for p in find_packages(include=[top, f"{top}.*"]))],
        "package_dir": {APP[top]: top for top in ("jobs", "actors")},
    }

setup(cmdclass={"build_py": BuildPy}, **layout)

"""The isolated environment of the ``lavis`` verifier backend: a virtualenv under ``{cache}/envs``.

salesforce-lavis 1.0.2 cannot share adjcap's environment (it needs transformers < 4.27, whose
``lavis/models/med.py`` helpers transformers 5.x removed, and timm 0.4.12), so it gets its own venv,
built with plain pip from the same package sources as this one (pip's own configuration applies).
Ray starts the LAVIS pools' workers with that venv's python (``runtime_env={"py_executable": ...}``).

What goes in, and why:

* **bridge packages at this environment's exact versions**: ray[data], torch, torchvision, numpy,
  pyarrow, pillow, pydantic. Ray workers of the two environments exchange pickled per-image states
  (PIL images, numpy arrays, torch tensors) and Arrow blocks, and the one pool actor runs adjcap's own
  stage code (``adjcap.engine.stages``: pydantic config, Arrow schema); a Ray worker must run the driver's Ray.
* ``salesforce-lavis==1.0.2`` with ``--no-deps``: its declared requirements include streamlit,
  plotly, opencv 4.5.5.64 (no wheel for Python 3.11), pre-commit and more that ITM never touches.
* what the ITM path uses: transformers 4.26.1 (LAVIS pins < 4.27), tokenizers 0.13.3, a
  huggingface-hub that 4.26 accepts, timm 0.4.12, fairscale 0.4.4, omegaconf, iopath, ftfy;
* what ``import lavis`` imports at module level though ITM never calls it: pandas, decord, webdataset,
  opencv-python-headless (a current one), einops, spacy, pycocoevalcap.

The bridge packages are not installed again: the environment links them, and everything they need
here, from this environment (``{env}/bridge``, on its path through a ``.pth`` file), so pip finds them
installed and the LAVIS workers import the very files the driver imports. That saves the 6 GB copy of
torch (and its CUDA libraries) and half the build's CPU (about 40 CPU-s instead of 86 on 2 cores; the
rest of its time is waiting on the package registry). A package the LAVIS pins need in another version
(none today) is installed by pip instead, and shadows the link. If this environment is moved or
removed, the links dangle and :func:`env_python` says to rebuild (``adjcap lavis-env --force``).

The directory name hashes the Python version, the full requirement list and this environment's
location, so a change of any builds a new environment beside the old one. A build is complete when
its marker file exists (written last, atomically); an incomplete directory is removed and rebuilt.
Builds take a file lock.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

from adjcap.storage.file_lock import holding

LAVIS_VERSION = "1.0.2"
BRIDGE = ("ray", "torch", "torchvision", "numpy", "pyarrow", "pillow", "pydantic")
ITM_DEPS = (
    "transformers==4.26.1",
    "tokenizers==0.13.3",
    "huggingface-hub>=0.11,<0.26",
    "timm==0.4.12",
    "fairscale==0.4.4",
    "omegaconf",
    "iopath",
    "ftfy",
)
IMPORT_DEPS = ("pandas", "decord", "webdataset", "opencv-python-headless", "einops>=0.4.1", "spacy", "pycocoevalcap")
MARKER = "adjcap-lavis-env.json"
BRIDGE_DIR = "bridge"
BRIDGE_PTH = "adjcap-bridge.pth"
SMOKE = "import lavis.models.blip_models.blip_image_text_matching, lavis.processors.blip_processors, ray.data, pydantic"


class LavisEnvError(FileNotFoundError):
    """The LAVIS environment is missing or could not be built; the message says what to do."""


def _pin(dist: str) -> str:
    version = metadata.version(dist).split("+")[0]  # torch 2.14.1+cu130 -> torch==2.14.1 (same index)
    return f"{'ray[data]' if dist == 'ray' else dist}=={version}"


def requirements() -> list[str]:
    """Everything the LAVIS environment gets, bridge packages pinned to this environment's versions."""
    return [*(_pin(d) for d in BRIDGE), *ITM_DEPS, *IMPORT_DEPS]


def env_dir(cache_dir: str | os.PathLike) -> Path:
    """``{cache}/envs/lavis-<hash of python version + requirements>``."""
    key = json.dumps({"python": sys.version.split()[0], "lavis": LAVIS_VERSION, "requirements": requirements(),
                      "bridge_from": str(_site_packages_here())})
    return Path(cache_dir).expanduser() / "envs" / f"lavis-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def env_python(cache_dir: str | os.PathLike) -> Path:
    """The LAVIS environment's python; a one-line error when it is not built."""
    d = env_dir(cache_dir)
    if not (d / MARKER).is_file():
        raise LavisEnvError(f"{d}: the LAVIS environment is not built; run `adjcap lavis-env` "
                            "(verifier.backend='lavis' needs it)")
    gone = dangling_links(d)
    if gone:
        raise LavisEnvError(f"{d}: {len(gone)} packages it links from {_site_packages_here()} are gone "
                            f"({', '.join(gone[:3])}); rebuild it with `adjcap lavis-env --force`")
    return d / "bin" / "python"


def status(cache_dir: str | os.PathLike) -> str:
    d = env_dir(cache_dir)
    marker = d / MARKER
    if marker.is_file():
        info = json.loads(marker.read_text())
        return f"built ({d}, {info.get('seconds', 0):.0f}s build)"
    return f"not built ({d}; `adjcap lavis-env` builds it)"


def _run(cmd: list[str], log: Path) -> None:
    with open(log, "a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    if done.returncode:
        tail = log.read_text().strip().splitlines()[-1:] or ["(no output)"]
        raise LavisEnvError(f"{log}: `{' '.join(cmd[:4])} ...` failed ({tail[0]}); see the log")


def build(cache_dir: str | os.PathLike, *, force: bool = False, echo=print) -> Path:
    """Build (or reuse) the LAVIS environment; returns its directory."""
    d = env_dir(cache_dir)
    d.parent.mkdir(parents=True, exist_ok=True)
    with holding(d.parent / f"{d.name}.lock", wait=True):
        if (d / MARKER).is_file() and not force:
            return d
        if d.exists():
            shutil.rmtree(d)
        t0 = time.time()
        log = d.parent / f"{d.name}.log"
        log.write_text("")
        base = getattr(sys, "_base_executable", sys.executable)
        echo(f"building the LAVIS environment in {d} (log: {log})")
        _run([base, "-m", "venv", str(d)], log)
        py = str(d / "bin" / "python")
        linked = link_bridge(d, _env_site_packages(py))
        _run([py, "-m", "pip", "install", "--disable-pip-version-check", *requirements()], log)
        _run([py, "-m", "pip", "install", "--disable-pip-version-check", "--no-deps",
              f"salesforce-lavis=={LAVIS_VERSION}"], log)
        _run([py, "-W", "ignore", "-c", SMOKE], log)
        info = {"lavis": LAVIS_VERSION, "requirements": requirements(), "python": sys.version.split()[0],
                "linked_from": str(_site_packages_here()), "linked": linked, "seconds": round(time.time() - t0, 1)}
        tmp = d / f".{MARKER}.tmp"
        tmp.write_text(json.dumps(info, indent=1) + "\n")
        os.replace(tmp, d / MARKER)
        echo(f"LAVIS environment built in {info['seconds']:.0f}s")
        return d


def _site_packages_here() -> Path:
    """Where this environment's bridge packages live (torch's site-packages)."""
    return Path(metadata.distribution("torch").locate_file("")).resolve()


def _env_site_packages(py: str) -> Path:
    out = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def bridge_closure() -> dict[str, metadata.Distribution]:
    """The bridge packages of this environment and everything they require here (environment markers
    evaluated, ray's ``data`` extra), by canonical name."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    found: dict[str, metadata.Distribution] = {}
    extras_seen: dict[str, set[str]] = {}
    todo: list[tuple[str, set[str]]] = [(d, {"data"} if d == "ray" else set()) for d in BRIDGE]
    while todo:
        name, extras = todo.pop()
        key = canonicalize_name(name)
        if key in found and extras <= extras_seen[key]:
            continue
        try:
            dist = found.get(key) or metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        found[key] = dist
        extras_seen[key] = extras_seen.get(key, set()) | extras
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in (extras or {""})):
                continue
            todo.append((req.name, set(req.extras)))
    return found


def _lavis_needs_other(closure: dict[str, metadata.Distribution]) -> set[str]:
    """Packages of the closure whose version here the LAVIS requirements do not accept: pip installs those."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    out = set()
    for spec in (*ITM_DEPS, *IMPORT_DEPS):
        req = Requirement(spec)
        key = canonicalize_name(req.name)
        if key in closure and not req.specifier.contains(closure[key].version, prereleases=True):
            out.add(key)
    return out


def link_bridge(d: Path, site_packages: Path) -> list[str]:
    """Link the bridge closure into ``d/bridge`` (each package's top-level entries, as its RECORD lists
    them) and put that folder on the environment's path (a ``.pth`` file); returns ``name==version``
    of every package linked."""
    closure = bridge_closure()
    other = _lavis_needs_other(closure)
    out = d / BRIDGE_DIR
    (out / "__pycache__").mkdir(parents=True, exist_ok=True)
    linked = []
    for key, dist in sorted(closure.items()):
        if key in other or not dist.files:
            continue
        base = Path(dist.locate_file(""))
        # a package's top-level entries (torch lists ~15,000 files under one folder), and the bytecode of
        # top-level single-file modules one by one (__pycache__ is shared by every package)
        tops = {Path(*f.parts) if f.parts[0] == "__pycache__" else Path(f.parts[0])
                for f in dist.files if f.parts and f.parts[0] != ".." and f.suffix != ".pth"}
        for rel in tops:
            target, link = base / rel, out / rel
            if target.exists() and not link.is_symlink():
                link.symlink_to(target, target_is_directory=target.is_dir())
        linked.append(f"{dist.metadata['Name']}=={dist.version}")
    (site_packages / BRIDGE_PTH).write_text(f"{out}\n")
    return linked


def dangling_links(d: Path) -> list[str]:
    """Links of ``d/bridge`` whose package is gone from the environment they were linked from."""
    out = d / BRIDGE_DIR
    if not out.is_dir():
        return []
    return sorted(p.name for p in [*out.iterdir(), *(out / "__pycache__").iterdir()]
                  if p.is_symlink() and not p.exists())


def code_dir(cache_dir: str | os.PathLike) -> Path:
    """A directory holding only a link to this adjcap package (the application layer's actors are inside
    it, docs/architecture.md "One layout"), for the LAVIS workers' PYTHONPATH: wherever adjcap is
    installed, nothing else of this environment (transformers 5, ...) can shadow the LAVIS environment's
    packages."""
    package = Path(__file__).resolve().parent.parent  # this file is adjcap/models/lavis_env.py
    d = env_dir(cache_dir) / "adjcap-code"
    d.mkdir(parents=True, exist_ok=True)
    link = d / "adjcap"
    if not (link.is_symlink() and Path(os.readlink(link)) == package):
        tmp = d / f".adjcap.{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(package, target_is_directory=True)
        os.replace(tmp, link)
    stale = d / "actors"  # an older layout linked the repository's actors/ beside adjcap
    if stale.is_symlink():
        stale.unlink()
    return d


def runtime_env(cache_dir: str | os.PathLike) -> dict:
    """Ray ``runtime_env`` for a LAVIS pool (actor level; merged with the job's).

    ``py_executable`` starts the pool's workers with the LAVIS venv's python (Ray 2.60's py_executable
    plugin; a pip/virtualenv runtime_env would rebuild the environment per Ray session and node, and
    ``py_modules`` with local directories is accepted only at the job level). PYTHONPATH, which overrides
    the job's, is :func:`code_dir`: this adjcap's code and nothing else.
    """
    py = env_python(cache_dir)
    return {
        "py_executable": str(py),
        "env_vars": {"PYTHONPATH": str(code_dir(cache_dir)),
                     "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "0"),
                     "TRANSFORMERS_OFFLINE": os.environ.get("TRANSFORMERS_OFFLINE", "0")},
    }

"""SPICE (Anderson et al. 2016) through ``spice-1.0.jar`` from pycocoevalcap, on Java 11+.

What differs from pycocoevalcap's ``Spice`` wrapper, and why:

* CoreNLP 3.6.0 (``stanford-corenlp-3.6.0.jar`` + ``stanford-corenlp-3.6.0-models.jar``) is
  looked up in a directory the user gives (``eval.spice_jars``, which may instead hold the CoreNLP
  zip), in pycocoevalcap's ``spice/lib``, or in adjcap's private download directory; it is
  downloaded only when ``eval.spice_download`` is true, by `adjcap prepare`'s downloader and safe
  extraction (resumable, deadlines, caps; one writer per folder). Every jar is verified against pinned
  digests first (:mod:`adjcap.metrics.trust`). Missing or unverified jars raise
  :class:`SpiceUnavailable` with instructions; callers report SPICE as missing.
* The parse cache (LMDB) lives in ``work_dir/spice`` (the run directory) or, without one, in
  ``$ADJCAP_CACHE/spice``; both are private (owned by you, 0700, checked). Scratch files, the JVM
  temp dir and the launcher live in a fresh private temp directory per run, never in a fixed
  shared path and never in site-packages.
* Java 9+ blocks the reflective access the cache's FST serialiser needs: the ``--add-opens``
  flags below open exactly the packages it touches (checked on Java 17).
* Java 15+ has no JavaScript engine, which SPICE's ``SpiceScorer`` uses to pretty-print its
  ``-out`` file. When a JDK compiler is present adjcap compiles a 40-line launcher
  (``resources/AdjcapSpiceRunner.java``) for each run that runs the same scorer and writes the same
  JSON; otherwise the jar's own main is used (fine on Java 8-14).
* Memory is configurable (``eval.java_mem``, -Xmx).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from adjcap.metrics.java import (
    JavaUnavailable,
    MetricError,
    find_java,
    find_javac,
    java_major_version,
    pycocoevalcap_dir,
    tail,
)
from adjcap.metrics.trust import (
    UntrustedFile,
    check_not_writable_by_others,
    default_cache_root,
    digest_matches,
    expected_digests,
    private_dir,
    read_manifest,
    verify_file,
    write_manifest,
)
from adjcap.prepare.download import Downloader, Item
from adjcap.prepare.errors import PrepareError
from adjcap.prepare.extract import extract
from adjcap.prepare.leftovers import sweep
from adjcap.prepare.limits import ExtractLimits, limits_of
from adjcap.prepare.runlock import RUN_LOCK_NAME, holding
from adjcap.prepare.sources import load_sources

CORENLP_VERSION = "3.6.0"
CORENLP_JARS = (f"stanford-corenlp-{CORENLP_VERSION}.jar", f"stanford-corenlp-{CORENLP_VERSION}-models.jar")
CORENLP_ZIP_DIR = "stanford-corenlp-full-2015-12-09"
CORENLP_ZIP = f"{CORENLP_ZIP_DIR}.zip"
CORENLP_URL = f"http://nlp.stanford.edu/software/{CORENLP_ZIP_DIR}.zip"
DOWNLOAD_DIR = ".download"  # in the private lib folder: the zip while it downloads (resumable) and is checked

# packages the FST serialiser of SPICE's LMDB parse cache reflects into (found on Java 17)
ADD_OPENS = (
    "java.base/java.lang",
    "java.base/java.math",
    "java.base/java.util",
    "java.base/java.util.concurrent",
    "java.base/java.net",
    "java.base/java.text",
    "java.base/java.io",
)

RUNNER_CLASS = "edu.anu.spice.AdjcapSpiceRunner"
SPICE_MAIN_CLASS = "edu.anu.spice.SpiceScorer"


class SpiceUnavailable(MetricError):
    """SPICE cannot be computed here (no CoreNLP jars, no Java, the jar failed, ...)."""


@dataclass
class SpiceConfig:
    """How to run SPICE. ``work_dir`` is the run directory (the parse cache goes in
    ``work_dir/spice``); None: adjcap's cache directory ($ADJCAP_CACHE/spice)."""

    work_dir: Path | None
    corenlp_dir: str | Path | None = None  # eval.spice_jars
    download: bool = False  # eval.spice_download
    download_dir: str | Path | None = None  # where downloaded jars go; default work_dir/spice/lib
    download_url: str = CORENLP_URL
    download_timeout: float = 60.0
    java: str = "java"
    mem: str = "8G"  # eval.java_mem
    threads: int | None = None
    use_cache: bool = True
    required: bool = False  # raise instead of reporting SPICE as missing
    timeout: float = 12 * 3600.0
    spice_jar: str | Path | None = None  # default: pycocoevalcap/spice/spice-1.0.jar

    @classmethod
    def from_eval_cfg(
        cls, eval_cfg: Any, work_dir: str | Path | None, cache_dir: str | Path | None = None
    ) -> SpiceConfig:
        """From ``Config.eval`` (fields spice_jars, spice_download, java, java_mem)."""
        return cls(
            work_dir=Path(work_dir) if work_dir is not None else None,
            corenlp_dir=getattr(eval_cfg, "spice_jars", None),
            download=bool(getattr(eval_cfg, "spice_download", False)),
            download_dir=(Path(cache_dir) / "spice" / "lib") if cache_dir is not None else None,
            java=getattr(eval_cfg, "java", "java"),
            mem=getattr(eval_cfg, "java_mem", "8G"),
        )

    @property
    def spice_dir(self) -> Path:
        """Where SPICE keeps state between runs (parse cache, downloaded jars); made private on use."""
        root = Path(self.work_dir) if self.work_dir is not None else default_cache_root()
        return root / "spice"

    @property
    def lib_dir(self) -> Path:
        return Path(self.download_dir) if self.download_dir else self.spice_dir / "lib"


def spice_jar_path(cfg: SpiceConfig) -> Path:
    jar = Path(cfg.spice_jar) if cfg.spice_jar else pycocoevalcap_dir() / "spice" / "spice-1.0.jar"
    if not jar.exists():
        raise SpiceUnavailable(f"spice-1.0.jar not found at {jar}; reinstall pycocoevalcap==1.2")
    return jar


def spice_lib_jars(spice_jar: Path) -> list[Path]:
    """The jars SPICE itself needs (shipped beside spice-1.0.jar in ``lib/``), by name: never a
    wildcard, and never a CoreNLP jar found there (those are verified separately)."""
    lib = spice_jar.parent / "lib"
    jars = sorted(p for p in lib.glob("*.jar") if p.is_file() and not p.name.startswith("stanford-corenlp-"))
    for p in [spice_jar, *jars]:
        try:
            check_not_writable_by_others(p)
        except UntrustedFile as e:
            raise SpiceUnavailable(str(e)) from None
    return jars


def _has_jars(d: Path) -> bool:
    return all((d / j).is_file() for j in CORENLP_JARS)


def _missing_message(looked: list[Path], extra: str = "") -> str:
    where = "; ".join(str(p) for p in looked)
    return (
        f"SPICE needs Stanford CoreNLP {CORENLP_VERSION} ({CORENLP_JARS[0]} and {CORENLP_JARS[1]}), "
        f"which were not found (looked in: {where}).{extra} To get SPICE: download "
        f"{CORENLP_ZIP} ({CORENLP_URL}), put it (or the two jars in it) in a directory of your own and set "
        "eval.spice_jars=DIR (CLI: `adjcap evaluate --spice-jars DIR`, or --set eval.spice_jars=DIR), or set "
        "eval.spice_download=true to "
        "download them on first use (about 400 MB; needs internet). Set eval.spice=false to skip SPICE. "
        "All other metrics are reported without it."
    )


def _verified(d: Path, manifest: dict[str, Any] | None = None) -> tuple[Path, Path]:
    """The two jars in ``d`` if each matches a pinned digest (or ``manifest``); else SpiceUnavailable."""
    try:
        for j in CORENLP_JARS:
            verify_file(d / j, j, manifest)
    except UntrustedFile as e:
        raise SpiceUnavailable(str(e)) from None
    return d / CORENLP_JARS[0], d / CORENLP_JARS[1]


def locate_corenlp(cfg: SpiceConfig) -> tuple[Path, Path]:
    """Find (or, if allowed, download) the two CoreNLP 3.6.0 jars and verify them; raise
    SpiceUnavailable (missing, or present but not matching the pinned digests)."""
    looked: list[Path] = []
    lib = cfg.lib_dir
    if cfg.corenlp_dir:
        d = Path(os.path.expanduser(str(cfg.corenlp_dir)))
        if _has_jars(d):
            try:  # pinned digests, or the manifest adjcap wrote when it extracted them (there or in lib)
                return _verified(d, {**_private_manifest(lib), **read_manifest(d)})
            except SpiceUnavailable:
                if not (d / CORENLP_ZIP).is_file():
                    raise
        if (d / CORENLP_ZIP).is_file():
            return _from_zip(d / CORENLP_ZIP, lib)
        looked.append(d)
    pkg_lib = pycocoevalcap_dir() / "spice" / "lib"
    if _has_jars(pkg_lib):
        return _verified(pkg_lib, _private_manifest(lib))
    looked.append(pkg_lib)
    if _has_jars(lib):
        return _verified(_checked_private(lib), read_manifest(lib))
    looked.append(lib)
    if not cfg.download:
        raise SpiceUnavailable(_missing_message(looked))
    try:
        download_corenlp(lib, url=cfg.download_url, timeout=cfg.download_timeout)
    except SpiceUnavailable as e:
        raise SpiceUnavailable(_missing_message(looked, f" Downloading them failed: {e}.")) from None
    return _verified(lib, read_manifest(lib))


def _checked_private(d: Path) -> Path:
    """``d`` and its parent (adjcap's spice/ folder) made private, or SpiceUnavailable."""
    try:
        private_dir(d.parent)
        return private_dir(d)
    except UntrustedFile as e:
        raise SpiceUnavailable(str(e)) from None


def _private_manifest(lib: Path) -> dict[str, Any]:
    return read_manifest(lib) if lib.is_dir() else {}


@contextmanager
def _owning(lib: Path) -> Iterator[Path]:
    """Hold the private ``lib`` for one writer (the run lock of `adjcap prepare`) and deal with what a
    killed earlier writer left there: half-extracted folders and unresumable partial downloads go, a
    resumable ``.partial`` stays for the download to continue. Another run's download or extraction
    into ``lib`` (an evaluation sharing the cache) is waited for. Yields lib's download folder."""
    lib = _checked_private(lib)
    work = lib / DOWNLOAD_DIR
    try:
        with holding(lib / RUN_LOCK_NAME, str(lib), wait=True):
            sweep(lib, work, depth=0)
            yield work
    except PrepareError as e:
        raise SpiceUnavailable(str(e)) from None


def _from_zip(zpath: Path, lib: Path) -> tuple[Path, Path]:
    """Verify a CoreNLP zip the user supplied and extract its two jars into the private ``lib``."""
    try:
        check_not_writable_by_others(zpath)
    except UntrustedFile as e:
        raise SpiceUnavailable(str(e)) from None
    with _owning(lib):
        extract_corenlp(zpath, lib, source=str(zpath))
    return _verified(lib, read_manifest(lib))


def extract_corenlp(zpath: Path, dest: Path, *, source: str, limits: ExtractLimits | None = None) -> None:
    """Check the zip's digest, then extract the two jars into the private ``dest`` with `adjcap prepare`'s
    safe extraction (every entry checked, size and ratio caps, CRCs; unpacked beside ``dest`` and renamed
    in, so a jar is either complete or absent) and record their sha256 in dest's manifest."""
    if not digest_matches(zpath, expected_digests().get(CORENLP_ZIP, {})):
        raise SpiceUnavailable(f"{source} is not the published {CORENLP_ZIP} (its sha1 differs); not extracted")
    members = [f"{CORENLP_ZIP_DIR}/{jar}" for jar in CORENLP_JARS]
    try:
        tmp, _ = extract(zpath, dest, members=members, limits=limits or limits_of(load_sources(None))[1])
    except PrepareError as e:
        raise SpiceUnavailable(f"{source} is not the expected CoreNLP zip: {e}") from None
    try:
        for jar, member in zip(CORENLP_JARS, members):
            os.replace(tmp / member, dest / jar)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    write_manifest(dest, list(CORENLP_JARS))


def download_corenlp(dest: Path, *, url: str = CORENLP_URL, timeout: float = 60.0) -> None:
    """Fetch the CoreNLP zip with `adjcap prepare`'s downloader (resume with If-Range, no byte for
    ``timeout`` s across retries or a drip below the minimum rate ends it, size checked), check its
    pinned digest, and extract the two jars into the private ``dest``; nothing is trusted before the
    digest matched. An interrupted download stays in ``dest/.download`` and the next call resumes it.
    Any failure raises SpiceUnavailable."""
    sources = load_sources(None)
    deadlines, limits = limits_of(sources)
    deadlines = dataclasses.replace(deadlines, stall_seconds=min(deadlines.stall_seconds, timeout))
    with _owning(dest) as work:
        if _has_jars(dest):
            try:
                _verified(dest, read_manifest(dest))
                return  # another run fetched them while this one waited for the lock
            except SpiceUnavailable:
                pass
        zpath = work / CORENLP_ZIP
        dl = Downloader(workers=1, host_limits=sources.get("hosts", {}), timeout=timeout, deadlines=deadlines)
        try:
            dl.fetch(Item(url=url, dest=zpath))
        except PrepareError as e:
            raise SpiceUnavailable(str(e)) from None  # names the URL
        try:
            extract_corenlp(zpath, dest, source=url, limits=limits)
        finally:
            zpath.unlink(missing_ok=True)  # verified or refused, it is not kept (the jars are)
            if work.is_dir() and not any(work.iterdir()):
                work.rmdir()


def compile_runner(cfg: SpiceConfig, spice_jar: Path, scratch: Path) -> Path | None:
    """Compile the packaged AdjcapSpiceRunner.java into ``scratch/runner`` (a private directory
    made for this run: no class found on disk is ever run); None without javac."""
    javac = find_javac(cfg.java)
    if javac is None:
        return None
    src_dir = scratch / "runner-src"
    out = scratch / "runner"
    src_dir.mkdir(mode=0o700)
    out.mkdir(mode=0o700)
    src = src_dir / "AdjcapSpiceRunner.java"
    src.write_text((resources.files("adjcap.metrics") / "resources" / "AdjcapSpiceRunner.java").read_text())
    proc = subprocess.run(
        [javac, "-nowarn", "-cp", str(spice_jar), "-d", str(out), str(src)],
        capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600,
    )
    if proc.returncode != 0:
        raise SpiceUnavailable(f"could not compile the SPICE launcher with {javac}: {tail(proc.stderr)}")
    return out


def spice_command(cfg: SpiceConfig, in_file: Path, out_file: Path, scratch: Path) -> list[str]:
    """The java command line that scores ``in_file`` into ``out_file``; ``scratch`` is this run's
    private temp directory (launcher, JVM temp files). Raises SpiceUnavailable."""
    try:
        java = find_java(cfg.java)
        major = java_major_version(cfg.java)
    except JavaUnavailable as e:
        raise SpiceUnavailable(str(e)) from None
    if major < 8:
        raise SpiceUnavailable(f"SPICE needs Java 8+; {java} is Java {major}")
    spice_jar = spice_jar_path(cfg)
    lib_jars = spice_lib_jars(spice_jar)
    core, models = locate_corenlp(cfg)
    runner = compile_runner(cfg, spice_jar, scratch)
    cp = [str(spice_jar), *(str(p) for p in lib_jars), str(core), str(models)]
    if runner is not None:
        cp.insert(0, str(runner))
        main = RUNNER_CLASS
    else:
        if major >= 15:
            raise SpiceUnavailable(
                f"Java {major} has no JavaScript engine, which spice-1.0.jar needs to write its output, "
                "and no javac was found to build adjcap's launcher that avoids it. Install a JDK "
                "(e.g. `apt-get install default-jdk-headless`) or run SPICE with Java 8-14 (eval.java=PATH)."
            )
        main = SPICE_MAIN_CLASS
    tmp = scratch / "tmp"
    tmp.mkdir(mode=0o700, exist_ok=True)
    cmd = [java, f"-Xmx{cfg.mem}", f"-Djava.io.tmpdir={tmp}"]
    if major >= 9:
        for pkg in ADD_OPENS:
            cmd += ["--add-opens", f"{pkg}=ALL-UNNAMED"]
    cmd += ["-cp", os.pathsep.join(cp), main, str(in_file), "-out", str(out_file), "-subset", "-silent"]
    if cfg.use_cache:
        try:
            cache = private_dir(private_dir(cfg.spice_dir) / "cache")
        except UntrustedFile as e:
            raise SpiceUnavailable(str(e)) from None
        cmd += ["-cache", str(cache)]
    if cfg.threads:
        cmd += ["-threads", str(int(cfg.threads))]
    return cmd


def _java_errors(stderr: bytes) -> str:
    """The exception lines of a Java stack trace (first few, without the 'at ...' frames)."""
    text = stderr.decode("utf-8", "replace")
    keep: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if ("Exception" in line or "Error" in line) and not line.startswith("at ") and line not in keep:
            keep.append(line)
    return " | ".join(keep[:4]) if keep else "no exception message"


def _float(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def compute_spice(
    predictions: Mapping[Hashable, str], references: Mapping[Hashable, Sequence[str]], cfg: SpiceConfig
) -> tuple[float, dict[Hashable, float]]:
    """SPICE F-score x100: (corpus mean, {image_id: per-image}). Raw (untokenised) captions, as
    pycocoevalcap passes them. Raises SpiceUnavailable when it cannot run."""
    ids = list(predictions)
    missing = [i for i in ids if not references.get(i)]
    if missing:
        raise ValueError(f"SPICE: {len(missing)} predictions have no references, e.g. {missing[:5]}")
    with tempfile.TemporaryDirectory(prefix="adjcap-spice-") as scratch_name:  # private (0700), fresh
        scratch = Path(scratch_name)
        in_file, out_file = scratch / "spice-in.json", scratch / "spice-out.json"
        # positions as ids (the output is mapped back by them); ASCII-escaped JSON so that SPICE's
        # default-charset FileReader reads non-ASCII captions correctly
        items = [{"image_id": k, "test": predictions[i], "refs": list(references[i])} for k, i in enumerate(ids)]
        in_file.write_text(json.dumps(items, ensure_ascii=True))
        cmd = spice_command(cfg, in_file, out_file, scratch)
        try:
            proc = subprocess.run(
                cmd, cwd=str(scratch), stdin=subprocess.DEVNULL, capture_output=True, timeout=cfg.timeout
            )
        except subprocess.TimeoutExpired:
            raise SpiceUnavailable(f"SPICE did not finish within {cfg.timeout:.0f}s") from None
        if proc.returncode != 0 or not out_file.exists() or out_file.stat().st_size == 0:
            raise SpiceUnavailable(
                f"SPICE failed (java exit {proc.returncode}): {_java_errors(proc.stderr)}. If it ran out of "
                f"memory raise eval.java_mem (now {cfg.mem}). stderr tail: {tail(proc.stderr, 800)}"
            )
        results = json.loads(out_file.read_text(encoding="utf-8"))
    per: dict[Hashable, float] = {}
    for item in results:
        k = int(item["image_id"])
        per[ids[k]] = 100.0 * _float(item["scores"]["All"]["f"])
    if len(per) != len(ids):
        raise SpiceUnavailable(f"SPICE returned {len(per)} scores for {len(ids)} images")
    # pycocoevalcap averages with np.mean in output order
    mean = float(np.mean(np.array([per[ids[int(it["image_id"])]] for it in results], dtype=np.float64)))
    return mean, per


def spice_status(eval_cfg: Any, work_dir: str | Path | None = None) -> str:
    """One line for `adjcap doctor`: whether SPICE would run with this ``Config.eval`` (no download
    is attempted)."""
    if not getattr(eval_cfg, "spice", True):
        return "disabled (eval.spice=false)"
    cfg = SpiceConfig.from_eval_cfg(eval_cfg, work_dir)
    cfg.download = False
    try:
        major = java_major_version(cfg.java)
        spice_jar_path(cfg)
        core, _ = locate_corenlp(cfg)
    except (SpiceUnavailable, JavaUnavailable) as e:
        first = str(e).split(". ")[0]
        hint = " (eval.spice_download=true would fetch them)" if getattr(eval_cfg, "spice_download", False) else ""
        return f"unavailable: {first}{hint}; set eval.spice_jars=DIR with the CoreNLP {CORENLP_VERSION} jars"
    launcher = "adjcap launcher (javac found)" if find_javac(cfg.java) else (
        "spice-1.0.jar main" + (" - needs Java <= 14" if major >= 15 else "")
    )
    return f"ready: Java {major}, verified CoreNLP jars in {core.parent}, {launcher}"

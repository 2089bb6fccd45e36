"""SPICE (Anderson et al. 2016) through ``spice-1.0.jar`` from pycocoevalcap, on Java 11+.

What differs from pycocoevalcap's ``Spice`` wrapper, and why:

* CoreNLP 3.6.0 (``stanford-corenlp-3.6.0.jar`` + ``stanford-corenlp-3.6.0-models.jar``) is
  looked up in a directory the user gives (``eval.spice_jars``), in pycocoevalcap's ``spice/lib``,
  or in adjcap's download directory; it is downloaded only when ``eval.spice_download`` is true.
  Missing jars raise :class:`SpiceUnavailable` with instructions; callers report SPICE as missing.
* Temp files, the parse cache (LMDB) and the JVM temp dir live under ``work_dir/spice`` (the run
  directory), never in site-packages.
* Java 9+ blocks the reflective access the cache's FST serialiser needs: the ``--add-opens``
  flags below open exactly the packages it touches (checked on Java 17).
* Java 15+ has no JavaScript engine, which SPICE's ``SpiceScorer`` uses to pretty-print its
  ``-out`` file. When a JDK compiler is present adjcap compiles a 40-line launcher
  (``resources/AdjcapSpiceRunner.java``) that runs the same scorer and writes the same JSON;
  otherwise the jar's own main is used (fine on Java 11-14).
* Memory is configurable (``eval.java_mem``, -Xmx).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import urllib.request
import zipfile
from collections.abc import Hashable, Mapping, Sequence
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

CORENLP_VERSION = "3.6.0"
CORENLP_JARS = (f"stanford-corenlp-{CORENLP_VERSION}.jar", f"stanford-corenlp-{CORENLP_VERSION}-models.jar")
CORENLP_ZIP_DIR = "stanford-corenlp-full-2015-12-09"
CORENLP_URL = f"http://nlp.stanford.edu/software/{CORENLP_ZIP_DIR}.zip"

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
    """How to run SPICE. ``work_dir`` is the run directory (temp files and cache go in
    ``work_dir/spice``)."""

    work_dir: Path
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
    def from_eval_cfg(cls, eval_cfg: Any, work_dir: str | Path, cache_dir: str | Path | None = None) -> SpiceConfig:
        """From ``Config.eval`` (fields spice_jars, spice_download, java, java_mem)."""
        return cls(
            work_dir=Path(work_dir),
            corenlp_dir=getattr(eval_cfg, "spice_jars", None),
            download=bool(getattr(eval_cfg, "spice_download", False)),
            download_dir=(Path(cache_dir) / "spice" / "lib") if cache_dir is not None else None,
            java=getattr(eval_cfg, "java", "java"),
            mem=getattr(eval_cfg, "java_mem", "8G"),
        )

    @property
    def spice_dir(self) -> Path:
        return Path(self.work_dir) / "spice"


def spice_jar_path(cfg: SpiceConfig) -> Path:
    jar = Path(cfg.spice_jar) if cfg.spice_jar else pycocoevalcap_dir() / "spice" / "spice-1.0.jar"
    if not jar.exists():
        raise SpiceUnavailable(f"spice-1.0.jar not found at {jar}; reinstall pycocoevalcap==1.2")
    return jar


def _has_jars(d: Path) -> bool:
    return all((d / j).is_file() for j in CORENLP_JARS)


def _missing_message(looked: list[Path], extra: str = "") -> str:
    where = "; ".join(str(p) for p in looked)
    return (
        f"SPICE needs Stanford CoreNLP {CORENLP_VERSION} ({CORENLP_JARS[0]} and {CORENLP_JARS[1]}), "
        f"which were not found (looked in: {where}).{extra} To get SPICE: download "
        f"{CORENLP_ZIP_DIR}.zip ({CORENLP_URL}), put those two jars in a directory and set "
        "eval.spice_jars=DIR (CLI: `adjcap evaluate --spice-jars DIR`, or --set eval.spice_jars=DIR), or set "
        "eval.spice_download=true to "
        "download them on first use (about 400 MB; needs internet). Set eval.spice=false to skip SPICE. "
        "All other metrics are reported without it."
    )


def locate_corenlp(cfg: SpiceConfig) -> tuple[Path, Path]:
    """Find (or, if allowed, download) the two CoreNLP 3.6.0 jars; raise SpiceUnavailable."""
    looked: list[Path] = []
    if cfg.corenlp_dir:
        d = Path(os.path.expanduser(str(cfg.corenlp_dir)))
        if _has_jars(d):
            return d / CORENLP_JARS[0], d / CORENLP_JARS[1]
        looked.append(d)
    lib = pycocoevalcap_dir() / "spice" / "lib"
    if _has_jars(lib):
        return lib / CORENLP_JARS[0], lib / CORENLP_JARS[1]
    looked.append(lib)
    dl = Path(cfg.download_dir) if cfg.download_dir else cfg.spice_dir / "lib"
    if _has_jars(dl):
        return dl / CORENLP_JARS[0], dl / CORENLP_JARS[1]
    looked.append(dl)
    if not cfg.download:
        raise SpiceUnavailable(_missing_message(looked))
    try:
        download_corenlp(dl, url=cfg.download_url, timeout=cfg.download_timeout)
    except SpiceUnavailable as e:
        raise SpiceUnavailable(_missing_message(looked, f" Downloading them failed: {e}.")) from None
    return dl / CORENLP_JARS[0], dl / CORENLP_JARS[1]


def download_corenlp(dest: Path, *, url: str = CORENLP_URL, timeout: float = 60.0) -> None:
    """Fetch the CoreNLP zip and extract the two jars into ``dest`` (atomically: a jar is either
    complete or absent). Any failure raises SpiceUnavailable."""
    dest.mkdir(parents=True, exist_ok=True)
    fd, zpath = tempfile.mkstemp(prefix=".corenlp-", suffix=".zip.tmp", dir=dest)
    os.close(fd)
    try:
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r, open(zpath, "wb") as f:
                shutil.copyfileobj(r, f, length=1 << 20)
        except OSError as e:  # URLError, timeouts, connection refused
            raise SpiceUnavailable(f"could not download {url}: {e}") from None
        try:
            with zipfile.ZipFile(zpath) as z:
                for jar in CORENLP_JARS:
                    member = f"{CORENLP_ZIP_DIR}/{jar}"
                    tmp = dest / f".{jar}.tmp"
                    with z.open(member) as src, open(tmp, "wb") as dst:
                        shutil.copyfileobj(src, dst, length=1 << 20)
                    os.replace(tmp, dest / jar)
        except (zipfile.BadZipFile, KeyError) as e:
            raise SpiceUnavailable(f"{url} is not the expected CoreNLP zip: {e}") from None
    finally:
        if os.path.exists(zpath):
            os.unlink(zpath)


def _compiled_runner(cfg: SpiceConfig, spice_jar: Path) -> Path | None:
    """Compile AdjcapSpiceRunner.java into work_dir/spice/runner (once); None without javac."""
    out = cfg.spice_dir / "runner"
    cls = out / "edu" / "anu" / "spice" / "AdjcapSpiceRunner.class"
    if cls.exists():
        return out
    javac = find_javac(cfg.java)
    if javac is None:
        return None
    src_dir = cfg.spice_dir / "runner-src"
    src_dir.mkdir(parents=True, exist_ok=True)
    src = src_dir / "AdjcapSpiceRunner.java"
    src.write_text((resources.files("adjcap.metrics") / "resources" / "AdjcapSpiceRunner.java").read_text())
    out.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [javac, "-nowarn", "-cp", str(spice_jar), "-d", str(out), str(src)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise SpiceUnavailable(f"could not compile the SPICE launcher with {javac}: {tail(proc.stderr)}")
    return out


def spice_command(cfg: SpiceConfig, in_file: Path, out_file: Path) -> list[str]:
    """The java command line that scores ``in_file`` into ``out_file``; raises SpiceUnavailable."""
    try:
        java = find_java(cfg.java)
        major = java_major_version(cfg.java)
    except JavaUnavailable as e:
        raise SpiceUnavailable(str(e)) from None
    if major < 8:
        raise SpiceUnavailable(f"SPICE needs Java 8+; {java} is Java {major}")
    spice_jar = spice_jar_path(cfg)
    core, models = locate_corenlp(cfg)
    lib = spice_jar.parent / "lib"
    runner = _compiled_runner(cfg, spice_jar)
    cp = [str(spice_jar), str(lib / "*"), str(core), str(models)]
    extra_dir = Path(os.path.expanduser(str(cfg.corenlp_dir))) if cfg.corenlp_dir else None
    if extra_dir is not None and extra_dir.is_dir():
        cp.append(str(extra_dir / "*"))  # e.g. a standalone Nashorn for Java 15+ without javac
    if runner is not None:
        cp.insert(0, str(runner))
        main = RUNNER_CLASS
    else:
        if major >= 15 and not (extra_dir and any(extra_dir.glob("nashorn*.jar"))):
            raise SpiceUnavailable(
                f"Java {major} has no JavaScript engine, which spice-1.0.jar needs to write its output, "
                "and no javac was found to build adjcap's launcher that avoids it. Install a JDK "
                "(e.g. `apt-get install default-jdk-headless`), run SPICE with Java 11 (eval.java=PATH), "
                "or put a standalone Nashorn jar (nashorn-core 15.x + its asm jars) in eval.spice_jars."
            )
        main = SPICE_MAIN_CLASS
    tmp = cfg.spice_dir / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    cmd = [java, f"-Xmx{cfg.mem}", f"-Djava.io.tmpdir={tmp}"]
    if major >= 9:
        for pkg in ADD_OPENS:
            cmd += ["--add-opens", f"{pkg}=ALL-UNNAMED"]
    cmd += ["-cp", os.pathsep.join(cp), main, str(in_file), "-out", str(out_file), "-subset", "-silent"]
    if cfg.use_cache:
        cache = cfg.spice_dir / "cache"
        cache.mkdir(parents=True, exist_ok=True)
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
    work = cfg.spice_dir
    work.mkdir(parents=True, exist_ok=True)
    fd, in_name = tempfile.mkstemp(prefix="spice-in-", suffix=".json", dir=work)
    os.close(fd)
    fd, out_name = tempfile.mkstemp(prefix="spice-out-", suffix=".json", dir=work)
    os.close(fd)
    in_file, out_file = Path(in_name), Path(out_name)
    try:
        # positions as ids (the output is mapped back by them); ASCII-escaped JSON so that SPICE's
        # default-charset FileReader reads non-ASCII captions correctly
        items = [{"image_id": k, "test": predictions[i], "refs": list(references[i])} for k, i in enumerate(ids)]
        in_file.write_text(json.dumps(items, ensure_ascii=True))
        cmd = spice_command(cfg, in_file, out_file)
        try:
            proc = subprocess.run(
                cmd, cwd=str(work), stdin=subprocess.DEVNULL, capture_output=True, timeout=cfg.timeout
            )
        except subprocess.TimeoutExpired:
            raise SpiceUnavailable(f"SPICE did not finish within {cfg.timeout:.0f}s") from None
        if proc.returncode != 0 or out_file.stat().st_size == 0:
            raise SpiceUnavailable(
                f"SPICE failed (java exit {proc.returncode}): {_java_errors(proc.stderr)}. If it ran out of "
                f"memory raise eval.java_mem (now {cfg.mem}). stderr tail: {tail(proc.stderr, 800)}"
            )
        results = json.loads(out_file.read_text(encoding="utf-8"))
    finally:
        for p in (in_file, out_file):
            if p.exists():
                p.unlink()
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
    wd = Path(work_dir) if work_dir is not None else Path(tempfile.gettempdir()) / "adjcap-spice"
    cfg = SpiceConfig.from_eval_cfg(eval_cfg, wd)
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
        "spice-1.0.jar main" + (" - needs Java <= 14 or Nashorn" if major >= 15 else "")
    )
    return f"ready: Java {major}, CoreNLP jars in {core.parent}, {launcher}"

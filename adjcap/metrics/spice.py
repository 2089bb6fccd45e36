"""SPICE (Anderson et al. 2016) through ``spice-1.0.jar`` from pycocoevalcap, on Java 11+.

What differs from pycocoevalcap's ``Spice`` wrapper, and why:

* CoreNLP 3.6.0 (``stanford-corenlp-3.6.0.jar`` + ``stanford-corenlp-3.6.0-models.jar``) is
  looked up and verified against pinned digests by :mod:`adjcap.java.corenlp` (in ``eval.spice_jars``,
  pycocoevalcap's ``spice/lib`` or adjcap's private download directory). `adjcap prepare` owns every
  download and unpacking: a CoreNLP zip in ``eval.spice_jars``, or the jars fetched when
  ``eval.spice_download`` is true, go through :mod:`adjcap.prepare.corenlp` (its downloader, safe
  extraction and run lock). Missing or unverified jars raise :class:`SpiceUnavailable` saying to run
  `adjcap prepare spice`; callers report SPICE as missing.
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

import json
import os
import subprocess
import tempfile
from collections.abc import Hashable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from adjcap.java import corenlp
from adjcap.java.corenlp import (  # noqa: F401 - the metric's public names
    CORENLP_JARS,
    CORENLP_VERSION,
    CORENLP_ZIP,
    CORENLP_ZIP_DIR,
    SpiceConfig,
    SpiceUnavailable,
    spice_jar_path,
    spice_lib_jars,
    spice_status,
)
from adjcap.java.runtime import JavaUnavailable, find_java, find_javac, java_major_version, tail
from adjcap.java.trust import UntrustedFile, private_dir
from adjcap.prepare.corenlp import download_corenlp, unpack_corenlp

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


def locate_corenlp(cfg: SpiceConfig) -> tuple[Path, Path]:
    """The two verified CoreNLP 3.6.0 jars (:func:`adjcap.java.corenlp.locate_corenlp`); a CoreNLP zip in
    ``eval.spice_jars`` is unpacked, and with ``cfg.download`` missing jars are fetched, by `adjcap prepare`
    (:mod:`adjcap.prepare.corenlp`). Raises SpiceUnavailable (missing, or not matching the pinned digests)."""
    return corenlp.locate_corenlp(cfg, unpack=unpack_corenlp, download=download_corenlp)


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

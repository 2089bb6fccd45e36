"""Finding and running Java for the caption metrics (PTB tokenizer, METEOR, SPICE).

The jars are the ones pycocoevalcap 1.2 ships; adjcap never writes into pycocoevalcap's package
directory (it may be read-only): temp files go to a directory the caller passes (the run directory)
or to the system temp directory.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path


class MetricError(RuntimeError):
    """A metric could not be computed; the message says why and what to do."""


class JavaUnavailable(MetricError):
    """No usable ``java`` executable."""


def pycocoevalcap_dir() -> Path:
    """The installed pycocoevalcap package directory (holds the metric jars)."""
    try:
        # pycocoevalcap's folders are namespace packages: locate it through a module file
        import pycocoevalcap.bleu.bleu as bleu_mod
    except ImportError as e:  # pragma: no cover - a dependency of the project
        raise MetricError(
            "pycocoevalcap is not installed; install it with `pip install pycocoevalcap==1.2`"
        ) from e
    return Path(bleu_mod.__file__).resolve().parent.parent


def find_java(java: str = "java") -> str:
    """Resolve the java executable (a name on PATH or a path); raise JavaUnavailable if missing."""
    path = shutil.which(java) if os.sep not in java else (java if os.access(java, os.X_OK) else None)
    if path is None:
        raise JavaUnavailable(
            f"Java was not found ('{java}'). The COCO caption metrics (PTB tokenizer, METEOR, SPICE) "
            "run Java jars: install a Java runtime 11+ (e.g. `apt-get install default-jre-headless`) "
            "or set eval.java to the java executable."
        )
    return path


@functools.lru_cache(maxsize=8)
def java_major_version(java: str = "java") -> int:
    """Major version of the given java (8 for 1.8, 11, 17, ...)."""
    exe = find_java(java)
    try:
        proc = subprocess.run([exe, "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        raise JavaUnavailable(f"could not run '{exe} -version': {e}") from e
    text = proc.stderr + proc.stdout
    m = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if not m:
        raise JavaUnavailable(f"could not parse the Java version from '{exe} -version': {text.strip()[:200]}")
    major = int(m.group(1))
    if major == 1 and m.group(2):  # "1.8.0_..." -> 8
        major = int(m.group(2))
    return major


def find_javac(java: str = "java") -> str | None:
    """javac next to the given java, else on PATH; None when there is no JDK."""
    try:
        exe = Path(find_java(java)).resolve()
    except JavaUnavailable:
        return None
    cand = exe.parent / "javac"
    if cand.exists() and os.access(cand, os.X_OK):
        return str(cand)
    return shutil.which("javac")


def tail(text: str | bytes, n: int = 1500) -> str:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    text = text.strip()
    return text if len(text) <= n else "..." + text[-n:]

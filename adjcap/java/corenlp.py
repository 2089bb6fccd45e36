"""Where SPICE's Stanford CoreNLP 3.6.0 jars are, whether they can be trusted, and whether SPICE
could run (``adjcap doctor``, the needs of a config). Nothing here downloads or unpacks: `adjcap
prepare` owns that (:mod:`adjcap.prepare.corenlp`), and :func:`locate_corenlp` asks it through the
``unpack`` / ``download`` functions its caller (:mod:`adjcap.metrics.spice`) passes.

The jars are looked up in a directory the user gives (``eval.spice_jars``, which may instead hold
the CoreNLP zip), in pycocoevalcap's ``spice/lib``, or in adjcap's private download directory; every
jar is verified against pinned digests first (:mod:`adjcap.java.trust`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adjcap.java.runtime import JavaUnavailable, MetricError, find_javac, java_major_version, pycocoevalcap_dir
from adjcap.java.trust import (
    UntrustedFile,
    check_not_writable_by_others,
    default_cache_root,
    private_dir,
    read_manifest,
    verify_file,
)

CORENLP_VERSION = "3.6.0"
CORENLP_JARS = (f"stanford-corenlp-{CORENLP_VERSION}.jar", f"stanford-corenlp-{CORENLP_VERSION}-models.jar")
CORENLP_ZIP_DIR = "stanford-corenlp-full-2015-12-09"
CORENLP_ZIP = f"{CORENLP_ZIP_DIR}.zip"
DOWNLOAD_DIR = ".download"  # in the private lib folder: the zip while it downloads (resumable) and is checked


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
    download_url: str | None = None  # None: the CoreNLP zip of `adjcap prepare`'s sources.toml ([spice] url)
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


def has_jars(d: Path) -> bool:
    return all((d / j).is_file() for j in CORENLP_JARS)


def missing_message(looked: list[Path], extra: str = "") -> str:
    where = "; ".join(str(p) for p in looked)
    return (
        f"SPICE needs Stanford CoreNLP {CORENLP_VERSION} ({CORENLP_JARS[0]} and {CORENLP_JARS[1]}), "
        f"which were not found (looked in: {where}).{extra} To get SPICE: run `adjcap prepare spice` and set "
        f"eval.spice_jars=DIR/spice/lib (DIR: its data folder), or put {CORENLP_ZIP} (or the two jars in it) "
        "in a directory of your own and set eval.spice_jars=DIR (CLI: `adjcap evaluate --spice-jars DIR`, or "
        "--set eval.spice_jars=DIR), or set eval.spice_download=true to have `adjcap prepare`'s downloader fetch "
        "them on first use (about 400 MB; needs internet). Set eval.spice=false to skip SPICE. "
        "All other metrics are reported without it."
    )


def verified(d: Path, manifest: dict[str, Any] | None = None) -> tuple[Path, Path]:
    """The two jars in ``d`` if each matches a pinned digest (or ``manifest``); else SpiceUnavailable."""
    try:
        for j in CORENLP_JARS:
            verify_file(d / j, j, manifest)
    except UntrustedFile as e:
        raise SpiceUnavailable(str(e)) from None
    return d / CORENLP_JARS[0], d / CORENLP_JARS[1]


def checked_private(d: Path) -> Path:
    """``d`` and its parent (adjcap's spice/ folder) made private, or SpiceUnavailable."""
    try:
        private_dir(d.parent)
        return private_dir(d)
    except UntrustedFile as e:
        raise SpiceUnavailable(str(e)) from None


def _private_manifest(lib: Path) -> dict[str, Any]:
    return read_manifest(lib) if lib.is_dir() else {}


# what `adjcap prepare` does for the metric: unpack(zip, lib) and download(lib, url, timeout), each
# leaving verified jars and their manifest in the private lib (or raising SpiceUnavailable)
Unpack = Callable[[Path, Path], None]
Download = Callable[[Path, "str | None", float], None]


def locate_corenlp(cfg: SpiceConfig, unpack: Unpack | None = None,
                   download: Download | None = None) -> tuple[Path, Path]:
    """Find the two CoreNLP 3.6.0 jars and verify them; a CoreNLP zip in ``cfg.corenlp_dir`` is
    unpacked and missing jars fetched (``cfg.download``) by the functions given (`adjcap prepare`'s);
    without them those cases are SpiceUnavailable too (missing, or present but not matching the
    pinned digests)."""
    looked: list[Path] = []
    lib = cfg.lib_dir
    if cfg.corenlp_dir:
        d = Path(os.path.expanduser(str(cfg.corenlp_dir)))
        zpath = d / CORENLP_ZIP
        if has_jars(d):
            try:  # pinned digests, or the manifest adjcap wrote when it extracted them (there or in lib)
                return verified(d, {**_private_manifest(lib), **read_manifest(d)})
            except SpiceUnavailable:
                if not zpath.is_file() or unpack is None:
                    raise
        if zpath.is_file() and unpack is not None:
            try:
                check_not_writable_by_others(zpath)
            except UntrustedFile as e:
                raise SpiceUnavailable(str(e)) from None
            unpack(zpath, lib)
            return verified(lib, read_manifest(lib))
        looked.append(d)
    pkg_lib = pycocoevalcap_dir() / "spice" / "lib"
    if has_jars(pkg_lib):
        return verified(pkg_lib, _private_manifest(lib))
    looked.append(pkg_lib)
    if has_jars(lib):
        return verified(checked_private(lib), read_manifest(lib))
    looked.append(lib)
    if not cfg.download or download is None:
        raise SpiceUnavailable(missing_message(looked))
    try:
        download(lib, cfg.download_url, cfg.download_timeout)
    except SpiceUnavailable as e:
        raise SpiceUnavailable(missing_message(looked, f" Downloading them failed: {e}.")) from None
    return verified(lib, read_manifest(lib))


def spice_status(eval_cfg: Any, work_dir: str | Path | None = None) -> str:
    """One line for `adjcap doctor`: whether SPICE would run with this ``Config.eval`` (nothing is
    downloaded or unpacked)."""
    if not getattr(eval_cfg, "spice", True):
        return "disabled (eval.spice=false)"
    cfg = SpiceConfig.from_eval_cfg(eval_cfg, work_dir)
    cfg.download = False
    zpath = Path(os.path.expanduser(str(cfg.corenlp_dir))) / CORENLP_ZIP if cfg.corenlp_dir else None
    try:
        major = java_major_version(cfg.java)
        spice_jar_path(cfg)
        try:
            where = f"verified CoreNLP jars in {locate_corenlp(cfg)[0].parent}"
        except SpiceUnavailable:
            if zpath is None or not zpath.is_file():
                raise
            where = f"CoreNLP zip in {zpath.parent} (checked and unpacked on first use)"
    except (SpiceUnavailable, JavaUnavailable) as e:
        first = str(e).split(". ")[0]
        hint = " (eval.spice_download=true would fetch them)" if getattr(eval_cfg, "spice_download", False) else ""
        return (f"unavailable: {first}{hint}; run `adjcap prepare spice` or set eval.spice_jars=DIR with the "
                f"CoreNLP {CORENLP_VERSION} jars")
    launcher = "adjcap launcher (javac found)" if find_javac(cfg.java) else (
        "spice-1.0.jar main" + (" - needs Java <= 14" if major >= 15 else "")
    )
    return f"ready: Java {major}, {where}, {launcher}"

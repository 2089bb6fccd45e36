"""What SPICE may execute: private directories, trusted file locations and pinned digests.

SPICE runs Java code from files on disk. Only these reach its classpath:

* adjcap's launcher, compiled from the packaged source into a fresh private temp directory for
  each run (never a class found on disk);
* pycocoevalcap's own ``spice-1.0.jar`` and ``spice/lib`` jars, by name, from a location no other
  user can write;
* the two CoreNLP 3.6.0 jars, only when their digest matches ``adjcap/metrics/resources/corenlp-3.6.0.digests.json``
  or the manifest adjcap wrote when it extracted them from a zip whose digest matched.

Directories adjcap writes SPICE state into (parse cache, downloaded jars, scratch files) are
private: owned by the effective user, mode 0700, not a symlink; anything else is refused.
"""

from __future__ import annotations

import functools
import json
import os
import stat
from collections.abc import Mapping
from importlib import resources
from pathlib import Path

from adjcap.storage.io import file_checksum
from adjcap.java.runtime import MetricError

DIGESTS_RESOURCE = "corenlp-3.6.0.digests.json"
MANIFEST_NAME = "corenlp-3.6.0.verified.json"
ALGORITHMS = ("sha256", "sha1")


class UntrustedFile(MetricError):
    """A file or directory SPICE would use is not safe to use; the message says why and what to do."""


def default_cache_root() -> Path:
    """adjcap's cache directory when no run directory is given: $ADJCAP_CACHE or ~/.cache/adjcap
    (the default of ``paths.cache_dir``)."""
    return Path(os.path.expanduser(os.environ.get("ADJCAP_CACHE") or "~/.cache/adjcap"))


def private_dir(path: str | Path) -> Path:
    """Create ``path`` (and parents) if needed and make sure it is private: a real directory (not a
    symlink) owned by the effective user with no group/other write bits; it is then set to 0700.
    Raise :class:`UntrustedFile` otherwise."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(p, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(p)
    euid = os.geteuid()
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UntrustedFile(f"{p} is a symlink or not a directory; remove it (adjcap keeps SPICE files only in a "
                            "private directory it creates)")
    if st.st_uid != euid:
        raise UntrustedFile(f"{p} is owned by uid {st.st_uid}, not by you (uid {euid}); remove it or choose another "
                            "run/cache directory")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UntrustedFile(f"{p} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}); remove it or "
                            f"`chmod 700 {p}`")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(p, 0o700)
    return p


def is_private_dir(path: str | Path) -> bool:
    """A real directory (not a symlink) of the effective user that no one else can write (checked
    only; nothing is changed)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return (stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()
            and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def check_not_writable_by_others(path: str | Path) -> None:
    """``path`` and its directory must belong to the effective user or root and be writable by
    nobody else (so what was verified is what Java later reads)."""
    euid = os.geteuid()
    for q in (Path(path), Path(path).parent):
        st = os.stat(q)
        if st.st_uid not in (euid, 0) or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise UntrustedFile(
                f"{q} can be changed by other users (owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}); "
                "SPICE only runs jars that only you (or root) can change: move them to a directory of your own"
            )


@functools.lru_cache(maxsize=1)
def expected_digests() -> dict[str, dict[str, frozenset[str]]]:
    """{file name: {algorithm: {hex digest, ...}}} from the packaged digests file."""
    doc = json.loads((resources.files("adjcap") / "metrics" / "resources" / DIGESTS_RESOURCE).read_text())
    return {
        name: {algo: frozenset(d.lower() for d in digests) for algo, digests in algos.items() if algo in ALGORITHMS}
        for name, algos in doc["files"].items()
    }


def digest_matches(path: str | Path, expected: Mapping[str, frozenset[str] | set[str]]) -> bool:
    return any(digests and file_checksum(path, algo) in digests for algo, digests in expected.items())


def read_manifest(lib_dir: Path) -> dict[str, dict[str, frozenset[str]]]:
    """The digests adjcap recorded for jars it extracted into ``lib_dir`` from a verified zip; empty
    unless the directory is private and the manifest is the user's own file."""
    m = lib_dir / MANIFEST_NAME
    try:
        st = os.lstat(m)
    except OSError:
        return {}
    if not is_private_dir(lib_dir):
        return {}
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return {}
    try:
        doc = json.loads(m.read_text())
        return {name: {"sha256": frozenset([str(d["sha256"]).lower()])} for name, d in doc.items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        return {}


def write_manifest(lib_dir: Path, names: list[str]) -> None:
    """Record the sha256 of ``names`` in ``lib_dir`` (atomically, mode 0600)."""
    doc = {n: {"sha256": file_checksum(lib_dir / n, "sha256")} for n in names}
    tmp = lib_dir / f".{MANIFEST_NAME}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(tmp, lib_dir / MANIFEST_NAME)


def verify_file(path: Path, name: str, extra: Mapping[str, Mapping[str, frozenset[str]]] | None = None) -> None:
    """Raise :class:`UntrustedFile` unless ``path`` (a copy of ``name``) matches a pinned digest
    (packaged, or ``extra`` from a trusted manifest) and only its owner or root can change it."""
    check_not_writable_by_others(path)
    pinned = expected_digests().get(name, {})
    if digest_matches(path, pinned) or (extra and digest_matches(path, extra.get(name, {}))):
        return
    known = [a for a, d in pinned.items() if d]
    why = (f"its sha256 {file_checksum(path, 'sha256')[:16]}... matches no pinned digest"
           if known or extra else "no published digest of it is pinned in adjcap")
    raise UntrustedFile(
        f"{path} is not a verified copy of {name} ({why}); SPICE does not run unverified jars. Put the CoreNLP zip "
        "stanford-corenlp-full-2015-12-09.zip in eval.spice_jars (its digest is checked and adjcap extracts the jars "
        "itself) or set eval.spice_download=true"
    )

"""The SPICE jars for an evaluation (``eval.spice_jars`` holding the CoreNLP zip, or
``eval.spice_download``): `adjcap prepare` owns every download and unpacking, so the metric asks
these two functions, which use prepare's downloader (resume with If-Range, deadlines, size checks),
safe extraction (every entry checked, size and ratio caps, CRCs) and run lock (one writer per
folder). The CoreNLP zip's URL is the ``[spice]`` source of ``sources.toml`` (also what `adjcap
prepare spice` fetches); the jars and their trust are :mod:`adjcap.java.corenlp`'s."""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from adjcap.java.corenlp import (
    CORENLP_JARS,
    CORENLP_ZIP,
    CORENLP_ZIP_DIR,
    DOWNLOAD_DIR,
    SpiceUnavailable,
    checked_private,
    has_jars,
    verified,
)
from adjcap.java.trust import digest_matches, expected_digests, read_manifest, write_manifest
from adjcap.prepare.download import Downloader, Item
from adjcap.prepare.errors import PrepareError
from adjcap.prepare.extract import extract
from adjcap.prepare.leftovers import sweep
from adjcap.prepare.limits import ExtractLimits, limits_of
from adjcap.prepare.runlock import RUN_LOCK_NAME, holding
from adjcap.prepare.sources import load_sources


def corenlp_url() -> str:
    """The CoreNLP zip's URL: the ``[spice]`` source of prepare's sources.toml."""
    return load_sources(None)["spice"]["url"]


@contextmanager
def _owning(lib: Path) -> Iterator[Path]:
    """Hold the private ``lib`` for one writer (the run lock of `adjcap prepare`) and deal with what a
    killed earlier writer left there: half-extracted folders and unresumable partial downloads go, a
    resumable ``.partial`` stays for the download to continue. Another run's download or extraction
    into ``lib`` (an evaluation sharing the cache) is waited for. Yields lib's download folder."""
    lib = checked_private(lib)
    work = lib / DOWNLOAD_DIR
    try:
        with holding(lib / RUN_LOCK_NAME, str(lib), wait=True):
            sweep(lib, work, depth=0)
            yield work
    except PrepareError as e:
        raise SpiceUnavailable(str(e)) from None


def unpack_corenlp(zpath: Path, lib: Path) -> None:
    """A CoreNLP zip the user supplied (``eval.spice_jars``), checked and unpacked into the private ``lib``."""
    with _owning(lib):
        extract_corenlp(zpath, lib, source=str(zpath))


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


def download_corenlp(dest: Path, url: str | None = None, timeout: float = 60.0) -> None:
    """Fetch the CoreNLP zip (``url``; None: :func:`corenlp_url`) with `adjcap prepare`'s downloader (resume
    with If-Range, no byte for ``timeout`` s across retries or a drip below the minimum rate ends it, size
    checked), check its pinned digest, and extract the two jars into the private ``dest``; nothing is
    trusted before the digest matched. An interrupted download stays in ``dest/.download`` and the next
    call resumes it. Any failure raises SpiceUnavailable."""
    url = url or corenlp_url()
    sources = load_sources(None)
    deadlines, limits = limits_of(sources)
    deadlines = dataclasses.replace(deadlines, stall_seconds=min(deadlines.stall_seconds, timeout))
    with _owning(dest) as work:
        if has_jars(dest):
            try:
                verified(dest, read_manifest(dest))
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

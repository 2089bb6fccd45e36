"""Archive sources (a zip laid out as a directory): fetch, check CRCs, extract safely, verify the
expected content, rename into place, and only then record the download's sha256 in the lock (a refused
archive is removed and never becomes the URL's trusted value)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable

from adjcap.prepare.errors import PrepareError
from adjcap.prepare.extract import extract, place, single_root
from adjcap.prepare.steps.base import Context, Planned
from adjcap.prepare.verify import zip_problem


def expected_files(src: dict[str, Any], check: Callable[[Path, int], str | None]) -> Callable[[Path], list[str]]:
    """``problems(root)`` for an archive source whose ``expect`` table maps files (relative to the laid-out
    root) to an expected count: each file present and ``check(path, count)`` None (else its problem)."""
    def problems(root: Path) -> list[str]:
        out = []
        for rel, n in src.get("expect", {}).items():
            p = root / rel
            if not p.is_file():
                out.append(f"{rel} missing")
            elif bad := check(p, int(n)):
                out.append(bad.replace(f"{root}/", ""))
        return out
    return problems


def archive_plan(ctx: Context, what: str, url: str, final: Path, approx: int | None, size: int | None = None) -> Planned:
    item = ctx.item(url, ctx.downloads / url.rsplit("/", 1)[-1], size=size, approx=approx)
    exact = item.size or (item.local.stat().st_size if item.local else ctx.downloader.head_size(item.url))
    return Planned(what, ctx.source_of(item), str(final), exact or approx, exact=bool(exact))


def install_archive(ctx: Context, step: str, url: str, final: Path, *, anchor: str,
                    problems: Callable[[Path], list[str]], approx: int | None = None,
                    size: int | None = None, sha256: str | None = None, take: str | None = None) -> str:
    """Fetch the zip at ``url`` and lay out its content (the folder holding ``anchor``) as ``final``;
    ``problems(root)`` lists what is wrong with an extracted tree (empty: accept); ``take``: lay out
    that folder of the archive (found at its top or one level down) instead of its root."""
    name = url.rsplit("/", 1)[-1]
    archive = ctx.downloads / name
    item = ctx.item(url, archive, size=size, sha256=sha256, approx=approx)
    got = ctx.fetch_one(item, f"{step} {name}")
    with ctx.validating(url, got, step):
        bad = zip_problem(archive)
        if bad:
            raise PrepareError(f"{ctx.source_of(item)}: {bad}; the archive was removed - run again")
        tmp, hashes = extract(archive, final.parent, limits=ctx.extract_limits)
        try:
            root = single_root(tmp, anchor, ctx.source_of(item))
            if take:
                root = root / take
            issues = problems(root)
            if issues:
                raise PrepareError(f"{ctx.source_of(item)}: {issues[0]}" + (f" (and {len(issues) - 1} more)" if len(issues) > 1 else "")
                                   + "; nothing was laid out")
            prefix = root.relative_to(tmp).as_posix()
            place(root, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    ctx.lock.forget_files(ctx.rel(final))
    for rel, (sha, n) in hashes.items():
        inner = rel if prefix == "." else rel[len(prefix) + 1:] if rel.startswith(prefix + "/") else None
        if inner:
            ctx.lock.record_file(f"{ctx.rel(final)}/{inner}", sha, n, step, ctx.source_of(item))
    archive.unlink(missing_ok=True)  # its sha256 stays in the lock
    return f"{name} laid out in {final} ({len(hashes)} files)"

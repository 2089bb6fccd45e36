"""What every step shares: options, the context (data dir, sources, lock, downloader, --from index),
dry-run lines, and laying out a set of images through a staging directory."""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

from adjcap.prepare.download import Downloader, Fetched, Item
from adjcap.prepare.errors import PrepareError
from adjcap.prepare.limits import ExtractLimits
from adjcap.prepare.lock import Lock
from adjcap.prepare.sources import mirrored
from adjcap.prepare.verify import image_problem, offenders


@dataclass
class Options:
    data: Path
    from_dir: Path | None = None
    dry_run: bool = False
    workers: int = 8
    preset: str = "headline"
    coco_zip: bool = False
    mirror: str | None = None
    sources: Path | None = None
    retries: int = 5
    backoff: float = 0.5
    timeout: float = 60.0
    hf_cache_dir: str | None = None
    sets: list[str] = field(default_factory=list)  # config overrides for the models step
    configs: list[Any] = field(default_factory=list)  # resolved configs (`--for`): the models step fetches theirs
    targets: list[str] = field(default_factory=list)  # `--for PRESET|TABLE` (repeatable)
    max_captions: int | None = None  # corpus steps: sample this many captions (adjcap.data.corpora.sample)


@dataclass
class Planned:
    """One line of `--dry-run`: what, from where, to where, how big (``exact``: a published/locked size
    or the server's; else an estimate)."""

    what: str
    source: str
    dest: str
    size: int | None
    exact: bool = False
    note: str = ""


@dataclass
class Context:
    opts: Options
    sources: dict[str, Any]
    lock: Lock
    downloader: Downloader
    say: Callable[[str], None]
    extract_limits: ExtractLimits = field(default_factory=ExtractLimits)
    _from_index: dict[str, Path] | None = field(default=None, repr=False)

    @property
    def data(self) -> Path:
        return self.opts.data

    @property
    def downloads(self) -> Path:
        return self.data / ".prepare" / "downloads"

    def staging(self, name: str) -> Path:
        return self.data / ".prepare" / "staging" / name

    def rel(self, path: Path) -> str:
        return Path(path).relative_to(self.data).as_posix()

    def url(self, url: str) -> str:
        return mirrored(url, self.opts.mirror)

    # ---- --from DIR -------------------------------------------------------------------------
    def local(self, *names: str) -> Path | None:
        """A file named ``names[i]`` (a base name) anywhere under --from DIR, or None."""
        if self.opts.from_dir is None:
            return None
        if self._from_index is None:
            root = self.opts.from_dir
            if not root.is_dir():
                raise PrepareError(f"{root}: --from directory not found")
            idx: dict[str, Path] = {}
            for d, _, files in os.walk(root):
                for f in files:
                    idx.setdefault(f, Path(d) / f)
            self._from_index = idx
        for n in names:
            hit = self._from_index.get(os.path.basename(n))
            if hit is not None:
                return hit
        return None

    def item(self, url: str, dest: Path, *, size: int | None = None, sha256: str | None = None,
             approx: int | None = None, local_names: tuple[str, ...] = ()) -> Item:
        """An Item for ``url`` (canonical, before the mirror): its sha256 from the lock when none is
        published; with --from, the local copy (PrepareError if it is not there)."""
        locked = None if sha256 else self.lock.download_sha(url)
        sha = sha256 or locked
        local = None
        if self.opts.from_dir is not None:
            names = local_names or (url.rsplit("/", 1)[-1],)
            local = self.local(*names)
            if local is None:
                raise PrepareError(
                    f"{names[0]} not found under --from {self.opts.from_dir} (it is the file {url}); "
                    "copy it there or drop --from to download it"
                )
        pinned = self.lock.entry_name(url) if locked else "sources.toml"
        return Item(url=self.url(url), dest=dest, size=size, sha256=sha, approx=approx, local=local,
                    pinned_by=pinned)

    def fetch_one(self, item: Item, label: str) -> Fetched:
        """Fetch one file (size and sha256 checked); nothing is recorded: see ``validating``."""
        return self.downloader.fetch_all([item], label)[0]

    @contextmanager
    def validating(self, url: str, got: Fetched, step: str) -> Iterator[None]:
        """Check ``got`` (the download of ``url``, canonical) in the body. Only when the body finishes
        is its sha256 recorded in the lock as the URL's trusted value; when it refuses the bytes
        (PrepareError) the file is removed and a lock record naming these bytes is dropped."""
        try:
            yield
        except PrepareError:
            Path(got.item.dest).unlink(missing_ok=True)
            if self.lock.forget_download(url, got.sha256):
                self.say(f"{step}: the refused bytes of {url} were the lock's trusted value; that record was dropped")
            raise
        self.lock.record_download(url, got.sha256, got.size, step)

    def source_of(self, item: Item) -> str:
        return str(item.local) if item.local is not None else item.url


class Step(Protocol):
    name: str
    summary: str

    def plan(self, ctx: Context) -> list[Planned]: ...

    def run(self, ctx: Context) -> str: ...

    def check(self, ctx: Context) -> list[str]: ...


# --------------------------------------------------------------------------------------------
# images laid out through a staging directory
# --------------------------------------------------------------------------------------------


def image_present(ctx: Context, path: Path) -> bool:
    """A laid-out image counts as present when the lock knows it at this size, or it decodes."""
    if not path.is_file():
        return False
    rec = ctx.lock.file_record(ctx.rel(path))
    if rec is not None and rec.get("size") == path.stat().st_size:
        return True
    return image_problem(path) is None


def lay_out_images(ctx: Context, step: str, wanted: dict[str, str], final: Path, *, approx: int | None,
                   local_names: Callable[[str], tuple[str, ...]] | None = None) -> str:
    """Make ``final/<name>`` exist and decode for every ``name -> url`` of ``wanted``. Missing ones are
    fetched into ``{data}/.prepare/staging/<step>``, checked, and only then moved into ``final``."""
    present = {n for n in wanted if image_present(ctx, final / n)}
    todo = sorted(n for n in wanted if n not in present)
    if not todo:
        return f"all {len(wanted)} images present in {final}"
    staging = ctx.staging(step)
    staging.mkdir(parents=True, exist_ok=True)
    items = [ctx.item(wanted[n], staging / n, approx=approx,
                      local_names=local_names(n) if local_names else ()) for n in todo]
    label = f"{step} images"
    got = ctx.downloader.fetch_all(items, label)
    bad = [n for n in todo if image_problem(staging / n) is not None]
    if bad:
        for n in bad:
            (staging / n).unlink(missing_ok=True)
        first = ctx.source_of(items[todo.index(bad[0])])
        raise PrepareError(
            f"{len(bad)} {step} images do not decode ({offenders(bad)}; the first from {first}); they were "
            f"removed, nothing was moved into {final} - run again"
        )
    by_dest = {str(f.item.dest): f for f in got}
    final.parent.mkdir(parents=True, exist_ok=True)
    if not final.exists():
        for p in staging.iterdir():  # leftovers of an older run that are not wanted now
            if p.name not in wanted:
                p.unlink() if p.is_file() else shutil.rmtree(p)
        os.rename(staging, final)
    else:
        for n in todo:
            os.replace(staging / n, final / n)
        shutil.rmtree(staging, ignore_errors=True)
    for it, n in zip(items, todo):
        f = by_dest.get(str(it.dest))
        if f is not None:
            ctx.lock.record_file(ctx.rel(final / n), f.sha256, f.size, step, ctx.source_of(it))
    return f"{len(todo)} images fetched, {len(present)} already present, in {final}"


def check_images(final: Path, names: list[str], step: str) -> list[str]:
    """Problems: missing or undecodable images among ``names`` under ``final``."""
    if not final.is_dir():
        return [f"{final}: missing (run `adjcap prepare {step}`)"]
    gone = [n for n in names if not (final / n).is_file()]
    if gone:
        return [f"{final}: {len(gone)} of {len(names)} images missing ({offenders(gone)})"]
    broken = [n for n in names if image_problem(final / n) is not None]
    if broken:
        return [f"{final}: {len(broken)} images do not decode ({offenders(broken)})"]
    return []

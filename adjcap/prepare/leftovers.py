"""What a killed `adjcap prepare` leaves behind, dealt with by the next run that holds the data folder's
run lock (so never another live run's files): half-extracted ``.extract-*`` folders and a half-placed
tree (``.<name>.old-<pid>``), stale temporary lock files, and ``.partial`` downloads that cannot be resumed
(no ``.meta``, empty, or the finished file already there) are removed; a ``.partial`` with its ``.meta``
is kept, and the download of the same file resumes it (with ``If-Range``, so never a splice)."""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from adjcap.prepare import extract, lock
from adjcap.prepare.download import META, PARTIAL, discard_partial, resumable
from adjcap.prepare.download_progress import human_bytes
from adjcap.prepare.runlock import RUN_LOCK_NAME

OLD_TREE = re.compile(r"\.(.+)" + re.escape(extract.OLD_INFIX) + "[0-9]+")
# extraction happens beside a step's destination ({data}/<a>/<b>): its parent is at most this deep
EXTRACT_DEPTH = 2


@dataclass
class Swept:
    removed: list[str] = field(default_factory=list)
    kept_partials: int = 0
    kept_bytes: int = 0

    def lines(self, where: Path) -> list[str]:
        out = []
        if self.removed:
            shown = ", ".join(self.removed[:3]) + (f" and {len(self.removed) - 3} more" if len(self.removed) > 3 else "")
            out.append(f"leftovers of an earlier run in {where} removed: {shown}")
        if self.kept_partials:
            out.append(f"{self.kept_partials} partial download(s) of an earlier run kept to resume "
                       f"({human_bytes(self.kept_bytes)})")
        return out


def sweep_partials(folder: Path, swept: Swept, root: Path) -> None:
    """Under ``folder``: drop the ``.partial`` files that cannot be resumed and ``.meta`` files without
    their ``.partial``; count the resumable ones."""
    if not folder.is_dir():
        return
    for dirpath, _, files in os.walk(folder):
        d = Path(dirpath)
        names = set(files)
        for f in sorted(files):
            p = d / f
            if not p.exists():  # its .meta, already removed with its .partial
                continue
            if f.endswith(PARTIAL):
                if f[: -len(PARTIAL)] in names or not resumable(p):  # finished already, or not resumable
                    discard_partial(p)
                    swept.removed.append(os.path.relpath(p, root))
                else:
                    swept.kept_partials += 1
                    swept.kept_bytes += p.stat().st_size
            elif (f.endswith(PARTIAL + META) and f[: -len(META)] not in names) or f.endswith(PARTIAL + META + ".tmp"):
                p.unlink()
                swept.removed.append(os.path.relpath(p, root))


def _sweep_extractions(data: Path, swept: Swept, depth: int) -> None:
    """``.extract-*`` folders, trees left aside by ``extract.place`` and the lock's temporary files, up
    to ``depth`` folders below ``data``; a folder holding its own run lock (another owner, e.g. an
    evaluation's SPICE jars) is not entered."""
    level = [data]
    for _ in range(depth + 1):
        below: list[Path] = []
        for d in level:
            try:
                entries = list(os.scandir(d))
            except OSError:
                continue
            names = {e.name for e in entries}
            if d != data and RUN_LOCK_NAME in names:
                continue
            for e in entries:
                real_dir = e.is_dir(follow_symlinks=False)
                if real_dir and e.name.startswith(extract.TMP_PREFIX):
                    shutil.rmtree(e.path, ignore_errors=True)
                    swept.removed.append(os.path.relpath(e.path, data))
                elif real_dir and OLD_TREE.fullmatch(e.name):  # extract.place: the tree it was replacing
                    final = OLD_TREE.fullmatch(e.name).group(1)
                    if final not in names:  # killed between its two renames: put it back
                        os.rename(e.path, os.path.join(d, final))
                        names.add(final)
                    else:
                        shutil.rmtree(e.path, ignore_errors=True)
                        swept.removed.append(os.path.relpath(e.path, data))
                elif d == data and e.name.startswith(lock.TMP_PREFIX) and e.is_file(follow_symlinks=False):
                    os.unlink(e.path)
                    swept.removed.append(e.name)
                elif e.is_dir() and e.name != ".prepare":  # a data folder may be a link to another disk
                    below.append(Path(e.path))
        level = below


def sweep(data: Path, work: Path, depth: int = EXTRACT_DEPTH) -> Swept:
    """Deal with the leftovers of killed runs in ``data`` (``work``: its download folder; ``depth``: how
    far below ``data`` extractions happen). Call only while holding the data folder's run lock."""
    swept = Swept()
    _sweep_extractions(data, swept, depth)
    sweep_partials(work, swept, data)
    return swept

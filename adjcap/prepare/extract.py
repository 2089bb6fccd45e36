"""Safe extraction: every entry is checked before anything is written, the archive is unpacked into a
hidden temporary directory beside the target, and the finished tree is renamed into place.

Refused (the whole archive): absolute paths, drive letters, ``..`` components, symlinks and hard links,
device files, FIFOs and sockets. Zip CRCs are checked while reading (a bad member aborts)."""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import stat
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import Iterable

from adjcap.prepare.errors import DiskFullError, PrepareError, UnsafeArchiveError

_DRIVE = re.compile(r"^[A-Za-z]:")


def unsafe_reason(name: str) -> str | None:
    """Why an archive entry name is unsafe, or None."""
    n = name.replace("\\", "/")
    if n.startswith("/") or _DRIVE.match(n):
        return "an absolute path"
    if ".." in n.split("/"):
        return "a '..' component"
    if "\x00" in n:
        return "a NUL byte"
    return None


def _zip_mode_problem(info: zipfile.ZipInfo) -> str | None:
    mode = info.external_attr >> 16
    if not mode:
        return None
    kind = stat.S_IFMT(mode)
    if kind == stat.S_IFLNK:
        return "a symlink"
    if kind in (stat.S_IFCHR, stat.S_IFBLK, stat.S_IFIFO, stat.S_IFSOCK):
        return "a device, FIFO or socket"
    return None


def _tar_problem(m: tarfile.TarInfo) -> str | None:
    if m.issym() or m.islnk():
        return "a link"
    if m.ischr() or m.isblk() or m.isfifo() or not (m.isfile() or m.isdir()):
        return "a device, FIFO or special entry"
    return None


def check_archive(path: Path, members: Iterable[str] | None = None) -> list[str]:
    """The entry names of a zip or tar archive after checking each is safe (UnsafeArchiveError names
    the first offender); ``members``: only these must be present (KeyError-like PrepareError)."""
    names: list[str] = []
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            for info in z.infolist():
                why = unsafe_reason(info.filename) or _zip_mode_problem(info)
                if why:
                    raise UnsafeArchiveError(
                        f"{path}: entry {info.filename!r} is {why}; refusing to extract this archive "
                        "(nothing was written) - get the file from its official source"
                    )
                names.append(info.filename)
    elif tarfile.is_tarfile(path):
        with tarfile.open(path) as t:
            for m in t.getmembers():
                why = unsafe_reason(m.name) or _tar_problem(m)
                if why:
                    raise UnsafeArchiveError(
                        f"{path}: entry {m.name!r} is {why}; refusing to extract this archive "
                        "(nothing was written) - get the file from its official source"
                    )
                names.append(m.name)
    else:
        raise PrepareError(f"{path}: neither a zip nor a tar archive; the download is damaged - delete it and run again")
    if members is not None:
        have = set(names)
        lost = [m for m in members if m not in have]
        if lost:
            raise PrepareError(f"{path}: does not hold {', '.join(lost)}; is it the right archive?")
    return names


def extract(archive: Path, parent: Path, members: Iterable[str] | None = None) -> tuple[Path, dict[str, tuple[str, int]]]:
    """Unpack ``archive`` (all of it, or only ``members``) into a new hidden temporary directory under
    ``parent``; return it and ``{relative path: (sha256, size)}`` of every file written. On any failure
    the temporary directory is removed."""
    wanted = list(members) if members is not None else None
    check_archive(archive, wanted)
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".extract-", dir=parent))
    hashes: dict[str, tuple[str, int]] = {}
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as z:
                for info in z.infolist():
                    if wanted is not None and info.filename not in wanted:
                        continue
                    target = tmp / info.filename
                    if info.is_dir():
                        target.mkdir(parents=True, exist_ok=True)
                        continue
                    with z.open(info) as src:
                        hashes[info.filename.replace("\\", "/")] = _write(src, target)
        else:
            with tarfile.open(archive) as t:
                for m in t.getmembers():
                    if wanted is not None and m.name not in wanted:
                        continue
                    target = tmp / m.name
                    if m.isdir():
                        target.mkdir(parents=True, exist_ok=True)
                        continue
                    src = t.extractfile(m)
                    assert src is not None
                    with src:
                        hashes[m.name] = _write(src, target)
    except zipfile.BadZipFile as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise PrepareError(f"{archive}: damaged ({e}); delete it and run again") from None
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFullError(
                f"{parent}: no space left on the device while extracting {archive.name}; free space and run "
                "again - nothing was laid out"
            ) from None
        raise PrepareError(f"{archive}: cannot extract into {parent} ({e.strerror or e})") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp, hashes


def _write(src, target: Path) -> tuple[str, int]:
    target.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    n = 0
    with open(target, "wb") as dst:
        while True:
            b = src.read(1 << 20)
            if not b:
                break
            dst.write(b)
            h.update(b)
            n += len(b)
    return h.hexdigest(), n


def single_root(tmp: Path, expect: str, archive_name: str = "the archive") -> Path:
    """The directory of ``tmp`` that holds ``expect`` (a relative path): ``tmp`` itself or one level of
    wrapping folders (archives differ in whether they wrap their content in a top directory)."""
    if (tmp / expect).exists():
        return tmp
    subs = [p for p in tmp.iterdir() if p.is_dir() and not p.name.startswith("__MACOSX")]
    for sub in subs:
        if (sub / expect).exists():
            return sub
    raise PrepareError(f"{archive_name} does not hold {expect} (looked at its top and one folder down); "
                      "is it the right archive? nothing was laid out")


def place(src: Path, final: Path) -> None:
    """Rename the finished directory ``src`` to ``final`` (replacing an older ``final``: renamed
    aside first, removed after), so ``final`` is never a half tree."""
    final.parent.mkdir(parents=True, exist_ok=True)
    if final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        if old.exists():
            shutil.rmtree(old)
        os.rename(final, old)
        os.rename(src, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(src, final)

"""Safe extraction: every entry is checked before anything is written, the archive is unpacked into a
hidden temporary directory beside the target, and the finished tree is renamed into place.

Refused (the whole archive, in one line, nothing left behind): absolute paths, drive letters, ``..``
components, NUL bytes in the raw entry name (zip's ``orig_filename``, which ``filename`` cuts at the
NUL), a name that appears twice (also after Unicode normalisation or differing only by case), symlinks and hard links, device
files, FIFOs and sockets, and archives that would expand past ``ExtractLimits`` (per member, in total,
or by compression ratio), checked from the headers before writing and counted again while writing.
Zip CRCs are checked while reading; a damaged, truncated or size-lying zip or tar is one clear error."""

from __future__ import annotations

import errno
import hashlib
import lzma
import os
import posixpath
import re
import shutil
import stat
import tarfile
import tempfile
import unicodedata
import zipfile
import zlib
from pathlib import Path
from typing import IO, Callable, Iterable

from adjcap.prepare.errors import DiskFullError, PrepareError, UnsafeArchiveError
from adjcap.prepare.limits import ExtractLimits

OLD_INFIX = ".old-"  # place(): .<final>.old-<pid>, the tree being replaced
TMP_PREFIX = ".extract-"  # the temporary folder an extraction is unpacked into, beside its target

_DRIVE = re.compile(r"^[A-Za-z]:")
# what the zip/tar/compression libraries raise for damaged, truncated or lying archives
_DAMAGED = (zipfile.BadZipFile, zipfile.LargeZipFile, tarfile.TarError, EOFError, zlib.error,
            lzma.LZMAError, NotImplementedError, ValueError)
_GET = "get the file from its official source"


def unsafe_reason(name: str) -> str | None:
    """Why an archive entry name is unsafe, or None."""
    n = name.replace("\\", "/")
    if "\x00" in n:
        return "a NUL byte in its name"
    if n.startswith("/") or _DRIVE.match(n):
        return "an absolute path"
    if ".." in n.split("/"):
        return "a '..' component"
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


def _damaged(path: Path, e: BaseException) -> PrepareError:
    what = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
    return PrepareError(f"{path}: damaged, truncated or not what its headers say ({what}); nothing was "
                        f"laid out - delete it and run again, or {_GET}")


def _refuse(path: Path, name: str | None, why: str, hint: str = "") -> UnsafeArchiveError:
    """``name``: the offending entry, or None when the archive as a whole is refused."""
    what = f"entry {name!r} is" if name is not None else "the archive holds"
    return UnsafeArchiveError(f"{path}: {what} {why}; refusing to extract this archive (nothing was "
                              f"written) - {_GET}{hint}")


def _key(name: str) -> str:
    """The name a file system would see: separators unified, NFC, no './' or trailing '/', and case
    folded (names that differ only by case are one file on macOS and Windows)."""
    n = unicodedata.normalize("NFC", name.replace("\\", "/"))
    n = posixpath.normpath(n).lstrip("/") if n.strip("/") else n
    return unicodedata.normalize("NFC", n.casefold())


def _zip_entries(path: Path, z: zipfile.ZipFile) -> list[tuple[str, str, bool, int, int]]:
    """(raw name, name, is dir, declared size, compressed size) of every zip entry."""
    out = []
    for info in z.infolist():
        raw = info.orig_filename
        why = unsafe_reason(raw) or unsafe_reason(info.filename) or _zip_mode_problem(info)
        if why:
            raise _refuse(path, raw, why)
        out.append((raw, info.filename, info.is_dir(), info.file_size, info.compress_size))
    return out


def _tar_entries(path: Path, t: tarfile.TarFile, lim: ExtractLimits) -> list[tuple[str, str, bool, int, int]]:
    """Like ``_zip_entries`` (compressed size: the declared size). Read one header at a time, and the
    caps are checked as they come: a compressed tar is not decompressed past a refusal."""
    out = []
    end = path.stat().st_size
    plain = _is_plain_tar(path)
    total = 0
    for m in t:
        why = unsafe_reason(m.name) or _tar_problem(m)
        if why:
            raise _refuse(path, m.name, why)
        if plain and m.isfile() and m.offset_data + m.size > end:
            raise PrepareError(f"{path}: entry {m.name!r} says {m.size} bytes but the archive ends before them "
                               f"(truncated or size-lying); nothing was laid out - delete it and run again, or {_GET}")
        total += m.size
        _over_caps(path, m.name, m.size, total, end, lim, compressed_stream=not plain)
        out.append((m.name, m.name, m.isdir(), m.size, m.size))
    return out


def _over_caps(path: Path, name: str, size: int, total: int, archive_bytes: int, lim: ExtractLimits,
               compressed_stream: bool) -> None:
    """Refuse a member over the member cap, a running total over the total cap, and a compressed tar
    that expands past the ratio cap."""
    if size > lim.max_member_bytes:
        raise _refuse(path, name, f"{size} bytes uncompressed, over the cap of {lim.max_member_bytes}",
                      " (or raise [limits] max_member_bytes in a --sources file if it is genuine)")
    if total > lim.max_total_bytes:
        raise _refuse(path, None, f"over {lim.max_total_bytes} bytes uncompressed in total (the cap)",
                      " (or raise [limits] max_total_bytes in a --sources file if it is genuine)")
    if compressed_stream and total >= lim.ratio_floor_bytes and total > lim.max_ratio * max(archive_bytes, 1):
        raise _refuse(path, None, f"{total} bytes or more in a {archive_bytes}-byte compressed tar (ratio over "
                      f"{lim.max_ratio:g}: a bomb?)", " (or raise [limits] max_ratio in a --sources file)")


def _is_plain_tar(path: Path) -> bool:
    with open(path, "rb") as f:
        magic = f.read(6)
    return not (magic.startswith(b"\x1f\x8b") or magic.startswith(b"BZh") or magic.startswith(b"\xfd7zXZ"))


def _check_sizes(path: Path, entries: list[tuple[str, str, bool, int, int]], lim: ExtractLimits,
                 archive_bytes: int, compressed_stream: bool) -> None:
    seen: dict[str, tuple[str, bool]] = {}
    total = 0
    for raw, name, is_dir, size, csize in entries:
        key = _key(name)
        if key in seen and not (is_dir and seen[key][1]):
            first = seen[key][0]
            also = "" if first == raw else f" (as {first!r}; names that differ only by case, Unicode form or './' are one file on macOS/Windows or after normalisation)"
            raise _refuse(path, raw, f"a name that appears twice in the archive{also}")
        seen[key] = (raw, is_dir)
        parent = posixpath.dirname(key)
        while parent:  # a folder a later entry implies must not be a file (nor the other way round)
            if parent in seen:
                if not seen[parent][1]:
                    raise _refuse(path, raw, f"a path through {seen[parent][0]!r}, which is a file in the archive "
                                  "(also when they differ only by case)")
                break
            seen[parent] = (raw, True)
            parent = posixpath.dirname(parent)
        if is_dir:
            continue
        if size >= lim.ratio_floor_bytes and size > lim.max_ratio * max(csize, 1) and not compressed_stream:
            raise _refuse(path, raw, f"{size} bytes from {csize} compressed (ratio over {lim.max_ratio:g}: a zip bomb?)",
                          " (or raise [limits] max_ratio in a --sources file if it is genuine)")
        total += size
        _over_caps(path, raw, size, total, archive_bytes, lim, compressed_stream)


def check_archive(path: Path, members: Iterable[str] | None = None, limits: ExtractLimits | None = None) -> list[str]:
    """The entry names of a zip or tar archive after checking each is safe and the whole fits
    ``limits`` (UnsafeArchiveError names the first offender; a damaged archive is a PrepareError);
    ``members``: only these must be present."""
    lim = limits or ExtractLimits()
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as z:
                entries = _zip_entries(path, z)
            compressed_stream = False
        elif tarfile.is_tarfile(path):
            with tarfile.open(path) as t:
                entries = _tar_entries(path, t, lim)
            compressed_stream = not _is_plain_tar(path)
        else:
            raise PrepareError(f"{path}: neither a zip nor a tar archive; the download is damaged - delete it and run again")
    except PrepareError:
        raise
    except _DAMAGED as e:
        raise _damaged(path, e) from None
    except OSError as e:
        if e.errno is None:  # gzip/bz2 report damaged streams as OSError without an errno
            raise _damaged(path, e) from None
        raise PrepareError(f"{path}: cannot read ({e.strerror or e})") from None
    _check_sizes(path, entries, lim, path.stat().st_size, compressed_stream)
    names = [name for _, name, _, _, _ in entries]
    if members is not None:
        have = set(names)
        lost = [m for m in members if m not in have]
        if lost:
            raise PrepareError(f"{path}: does not hold {', '.join(lost)}; is it the right archive?")
    return names


class _Budget:
    """The caps counted while writing: a member may not pass its declared size or the member cap, nor
    (past the ratio floor) its compressed size times the ratio; all members together not the total cap."""

    def __init__(self, archive: Path, lim: ExtractLimits):
        self.archive, self.lim, self.total = archive, lim, 0

    def member(self, name: str, declared: int, compressed: int | None) -> Callable[[int, int], None]:
        lim = self.lim
        cap = min(declared, lim.max_member_bytes)
        ratio_cap = lim.max_ratio * max(compressed, 1) if compressed is not None else None

        def add(n: int, written: int) -> None:
            self.total += n
            if written > cap:
                why = (f"more than its declared {declared} bytes" if written > declared
                       else f"over the cap of {lim.max_member_bytes} bytes")
                raise _refuse(self.archive, name, f"expanding to {why} while writing")
            if ratio_cap is not None and written >= lim.ratio_floor_bytes and written > ratio_cap:
                raise _refuse(self.archive, name, f"expanding past {lim.max_ratio:g} times its compressed "
                              f"{compressed} bytes while writing (a zip bomb?)")
            if self.total > lim.max_total_bytes:
                raise _refuse(self.archive, name, f"taking the archive past the total cap of "
                              f"{lim.max_total_bytes} bytes while writing")
        return add


def extract(archive: Path, parent: Path, members: Iterable[str] | None = None,
            limits: ExtractLimits | None = None) -> tuple[Path, dict[str, tuple[str, int]]]:
    """Unpack ``archive`` (all of it, or only ``members``) into a new hidden temporary directory under
    ``parent``; return it and ``{relative path: (sha256, size)}`` of every file written. On any failure
    the temporary directory is removed."""
    lim = limits or ExtractLimits()
    wanted = list(members) if members is not None else None
    check_archive(archive, wanted, lim)
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=TMP_PREFIX, dir=parent))
    hashes: dict[str, tuple[str, int]] = {}
    budget = _Budget(archive, lim)
    try:
        if zipfile.is_zipfile(archive):
            with zipfile.ZipFile(archive) as z:
                for info in z.infolist():
                    if wanted is not None and info.filename not in wanted:
                        continue
                    target = tmp / info.filename
                    if info.is_dir():
                        _mkdir(target)
                        continue
                    add = budget.member(info.filename, info.file_size, info.compress_size)
                    with z.open(info) as src:
                        hashes[info.filename.replace("\\", "/")] = _write(src, target, add)
        else:
            with tarfile.open(archive) as t:
                for m in t:
                    if wanted is not None and m.name not in wanted:
                        continue
                    target = tmp / m.name
                    if m.isdir():
                        _mkdir(target)
                        continue
                    src = t.extractfile(m)
                    if src is None:
                        raise _refuse(archive, m.name, "not a regular file")
                    add = budget.member(m.name, m.size, None)
                    with src:
                        hashes[m.name] = _write(src, target, add)
                    if hashes[m.name][1] != m.size:
                        raise _damaged(archive, EOFError(f"{m.name}: {hashes[m.name][1]} of {m.size} bytes"))
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, PrepareError):
            raise
        if isinstance(e, _TargetFailed):
            if e.err.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DiskFullError(
                    f"{parent}: no space left on the device while extracting {archive.name}; free space and run "
                    "again - nothing was laid out"
                ) from None
            raise PrepareError(f"{archive}: cannot extract into {parent} ({e.err.strerror or e.err}); "
                               "check the permissions of --data") from None
        if isinstance(e, (*_DAMAGED, OSError)):  # reading the archive failed
            raise _damaged(archive, e) from None
        raise
    return tmp, hashes


class _TargetFailed(Exception):
    """Writing the extracted tree failed (not reading the archive)."""

    def __init__(self, err: OSError):
        super().__init__(str(err))
        self.err = err


def _mkdir(d: Path) -> None:
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _TargetFailed(e) from None


def _write(src: IO[bytes], target: Path, add: Callable[[int, int], None]) -> tuple[str, int]:
    h = hashlib.sha256()
    n = 0
    _mkdir(target.parent)
    try:
        dst = open(target, "wb")
    except OSError as e:
        raise _TargetFailed(e) from None
    with dst:
        while True:
            b = src.read(1 << 20)  # errors here are the archive's
            if not b:
                break
            add(len(b), n + len(b))
            try:
                dst.write(b)
            except OSError as e:
                raise _TargetFailed(e) from None
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
        old = final.with_name(f".{final.name}{OLD_INFIX}{os.getpid()}")
        if old.exists():
            shutil.rmtree(old)
        os.rename(final, old)
        os.rename(src, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(src, final)

"""``{data}/prepare.lock.json``: the sha256 of everything `adjcap prepare` downloaded and laid out.

``downloads``: per source URL (as in sources.toml, before any mirror), the sha256 and size of the bytes
received, recorded only once those bytes passed every check of their step (archive CRCs, safe
extraction, the expected files, counts); a later download of the same URL must match (sources that
publish no checksum are pinned by their first validated download). An entry whose bytes are refused
later is dropped. ``files``: per laid-out file (relative to ``{data}``), its sha256, size, step and
source. ``models``: per hub model, the snapshot revision in the HF cache. ``adjcap prepare --verify``
re-hashes the files; copy the lock to another machine to check it got the same bytes."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable

from adjcap.prepare.errors import PrepareError
from adjcap.storage.content_ids import PREPARE_LOCK
from adjcap.storage.io import file_checksum

LOCK_NAME = PREPARE_LOCK  # adjcap.storage.content_ids reads it (a prepared checkpoint keeps its id)
TMP_PREFIX = ".prepare.lock-"  # save(): written whole, then renamed over the lock


class Lock:
    def __init__(self, data: Path):
        self.path = Path(data) / LOCK_NAME
        self.data_dir = Path(data)
        self.doc: dict[str, Any] = {"version": 1, "downloads": {}, "files": {}, "models": {}}
        self.dirty = False
        if self.path.exists():
            try:
                loaded = json.loads(self.path.read_text())
            except (ValueError, OSError) as e:
                raise PrepareError(f"{self.path}: unreadable ({e}); move it away to start a fresh lock") from None
            if not isinstance(loaded, dict) or loaded.get("version") != 1:
                raise PrepareError(f"{self.path}: not a version-1 prepare lock; move it away to start a fresh one")
            for key in ("downloads", "files", "models"):
                loaded.setdefault(key, {})
            self.doc = loaded

    # ---- reading --------------------------------------------------------------------------
    def download_sha(self, url: str) -> str | None:
        rec = self.doc["downloads"].get(url)
        return rec.get("sha256") if rec else None

    def file_record(self, rel: str) -> dict[str, Any] | None:
        return self.doc["files"].get(rel)

    def files_of(self, steps: Iterable[str] | None) -> dict[str, dict[str, Any]]:
        wanted = None if steps is None else set(steps)
        return {k: v for k, v in self.doc["files"].items() if wanted is None or v.get("step") in wanted}

    # ---- writing --------------------------------------------------------------------------
    def record_download(self, url: str, sha256: str, size: int, step: str) -> None:
        self.dirty = True
        self.doc["downloads"][url] = {"sha256": sha256, "size": size, "step": step,
                                      "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}

    def forget_download(self, url: str, sha256: str) -> bool:
        """Drop the record of ``url`` when it names ``sha256`` (bytes that were refused); True if dropped."""
        rec = self.doc["downloads"].get(url)
        if rec is None or rec.get("sha256") != sha256:
            return False
        del self.doc["downloads"][url]
        self.dirty = True
        return True

    def entry_name(self, url: str) -> str:
        """How an error names the record of ``url`` (what a user deletes to clear it)."""
        return f'"downloads" entry "{url}" of {self.path}'

    def record_file(self, rel: str, sha256: str, size: int, step: str, source: str) -> None:
        self.dirty = True
        self.doc["files"][rel] = {"sha256": sha256, "size": size, "step": step, "source": source}

    def forget_files(self, prefix: str) -> None:
        """Drop the records of files under ``prefix`` (a directory replaced as a whole)."""
        p = prefix.rstrip("/") + "/"
        self.dirty = True
        for k in [k for k in self.doc["files"] if k.startswith(p)]:
            del self.doc["files"][k]

    def record_model(self, key: str, info: dict[str, Any]) -> None:
        self.dirty = True
        self.doc["models"][key] = info

    def save(self) -> None:
        """Write atomically (temp file + rename), when anything was recorded."""
        if not self.dirty:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, suffix=".json", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(self.doc, f, indent=1, sort_keys=True)
                f.write("\n")
            os.replace(tmp, self.path)
            self.dirty = False
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    # ---- checking -------------------------------------------------------------------------
    def verify(self, steps: Iterable[str] | None = None) -> list[str]:
        """Re-hash every recorded file (of ``steps``); one problem string per missing/altered file."""
        problems = []
        for rel, rec in sorted(self.files_of(steps).items()):
            p = self.data_dir / rel
            if not p.is_file():
                problems.append(f"{rel}: missing")
                continue
            size = p.stat().st_size
            if size != rec.get("size"):
                problems.append(f"{rel}: {size} bytes, locked {rec.get('size')}")
            elif file_checksum(p) != rec.get("sha256"):
                problems.append(f"{rel}: sha256 differs from the lock")
        return problems

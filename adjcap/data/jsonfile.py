"""Reading an annotation JSON file, with errors that name the file and say what is wrong."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from adjcap.data.records import DataError

try:  # optional: 3-5x faster on the 150 MB Karpathy files
    import orjson

    def _loads(raw: bytes) -> Any:
        return orjson.loads(raw)

except ImportError:  # pragma: no cover - depends on the environment

    def _loads(raw: bytes) -> Any:
        return json.loads(raw)


def load_json(path: Path) -> Any:
    """Parse ``path``; DataError when it is missing, a directory, unreadable, empty or not JSON."""
    if not path.exists():
        raise DataError(
            f"{path}: file not found. Check the path (for a configured benchmark: "
            "--set benchmarks.<name>.annotations=FILE); see the README for where each benchmark's "
            "annotation files come from."
        )
    if path.is_dir():
        raise DataError(f"{path}: is a directory, expected a JSON annotation file")
    if not path.is_file():  # a FIFO or a device would block or never end
        raise DataError(f"{path}: not a regular file, expected a JSON annotation file")
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise DataError(f"{path}: cannot be read ({e})") from e
    if not raw.strip():
        raise DataError(f"{path}: the file is empty; expected JSON annotations (re-download or re-copy it)")
    try:
        return _loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise DataError(
            f"{path}: not valid JSON ({e}); the file is probably truncated or not an annotation file"
        ) from e

"""Read a W&B offline run back from its own files: the ``run-<id>.wandb`` transaction log (W&B's
LevelDB-style record log: a 7-byte file header, 32 KiB blocks, each record chunk with a 7-byte header
of CRC-32, length and type) holding protobuf ``Record`` messages."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[Any]:
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a W&B run file"
    pos, buf, out = 7, b"", []
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # the block's tail is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos: pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        chunk = data[pos + 7: pos + 7 + length]
        pos += 7 + length
        buf = chunk if kind in (FULL, FIRST) else buf + chunk
        if kind in (FULL, LAST):
            rec = pb.Record()
            rec.ParseFromString(buf)
            out.append(rec)
            buf = b""
    return out


def offline_run(path: Path) -> dict[str, Any]:
    """{"id", "tags", "config", "history", "summary", "artifacts": {name: [files]}} of one run file."""
    out: dict[str, Any] = {"config": {}, "history": {}, "summary": {}, "artifacts": {}}
    for r in records(path):
        kind = r.WhichOneof("record_type")
        if kind == "run":
            out["id"], out["tags"] = r.run.run_id, list(r.run.tags)
            out["config"].update({u.key: json.loads(u.value_json) for u in r.run.config.update})
        elif kind == "config":
            out["config"].update({u.key: json.loads(u.value_json) for u in r.config.update})
        elif kind == "history":
            out["history"].update({u.key or "/".join(u.nested_key): json.loads(u.value_json) for u in r.history.item})
        elif kind == "summary":
            out["summary"].update({u.key or "/".join(u.nested_key): json.loads(u.value_json) for u in r.summary.update})
        elif kind == "artifact":
            out["artifacts"][r.artifact.name] = [m.path for m in r.artifact.manifest.contents]
    return out

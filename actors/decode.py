"""CPU task ahead of the GPU pools: records -> decoded images inside fresh states."""

from __future__ import annotations

from typing import Any

from actors.transport import pack
from adjcap.stages import decode_state


def decode_batch(batch: dict[str, Any]) -> dict[str, Any]:
    return pack([
        decode_state(str(batch["image_id"][i]), str(batch["benchmark"][i]), str(batch["split"][i]),
                     str(batch["domain"][i] or "") or None, str(batch["image_path"][i] or "") or None,
                     str(batch["error"][i] or "") or None if "error" in batch else None,
                     bool(batch["exif"][i]) if "exif" in batch else False)
        for i in range(len(batch["image_id"]))
    ])

"""CPU task ahead of the GPU pools: records -> decoded images inside fresh states."""

from __future__ import annotations

from typing import Any

from actors.transport import pack
from adjcap.data.images import DecodedImage, decode_image
from adjcap.stages import ImageState


def decode_batch(batch: dict[str, Any]) -> dict[str, Any]:
    states = []
    for i in range(len(batch["image_id"])):
        s = ImageState(
            image_id=str(batch["image_id"][i]),
            benchmark=str(batch["benchmark"][i]),
            split=str(batch["split"][i]),
            domain=str(batch["domain"][i] or "") or None,
        )
        listed_error = str(batch["error"][i]) if "error" in batch else ""
        d = DecodedImage(None, listed_error) if listed_error else decode_image(batch["image_path"][i])
        if d.error:
            s.error = f"decode: {d.error}"
        else:
            s.image = d.image
        states.append(s)
    return pack(states)

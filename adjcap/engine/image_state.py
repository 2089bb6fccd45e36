"""The per-image state the stages fill (:mod:`adjcap.engine.stages`; their list: :mod:`adjcap.engine.stage_registry`),
from the decoded image to the scored beam, and how it is made from a record and carried between Ray pools.

Apart from the stage functions so that the CPU tasks that decode images (``actors/decode.py``) and
the stage cache load without PyTorch: a decoding process starts on 1.8 CPU-s instead of ~4.1."""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from adjcap.data.images import decode_image, read_image_file
from adjcap.engine.features import empty_row
from adjcap.engine.pixel_prep import PixelPrep

@dataclass
class ImageState:
    image_id: str
    benchmark: str
    split: str
    domain: str | None = None
    error: str | None = None
    # the image as encoded bytes (see :func:`encode_for_transport`): what travels between pools
    encoded: bytes | None = None
    image: Any = None  # the decoded PIL.Image (RGB), cached in one process; not pickled when encoded is set
    # the pixels the decode task prepared for the pools' models, by geometry (adjcap.engine.pixel_prep): uint8 [H, W, 3]
    pixels: dict[str, np.ndarray] = field(default_factory=dict)
    retrieved: list[dict] = field(default_factory=list)
    verified: list[dict] = field(default_factory=list)
    entities: list[str] = field(default_factory=list)
    prompt: str | None = None
    candidates: list[dict] = field(default_factory=list)
    retrieval_embedding: np.ndarray | None = None  # stage 1 image embedding, reused by stage 4
    verifier_memo: Any = None  # stage 2 image encoding, reused by stage 4
    verifier_backend: str | None = None  # which verifier backend scored this image (None: no verifier)
    done: set[str] = field(default_factory=set)  # stages whose output the state holds (skipped by them)
    computed: set[str] = field(default_factory=set)  # stages that ran on this image in this run
    # outputs of stages without a field above (a stage registered beyond the four), by name
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None

    def pil(self):
        """The decoded image (decoded from ``encoded`` on first use in this process)."""
        if self.image is None and self.encoded is not None:
            d = decode_image(self.encoded, name=self.image_id)
            if d.error:  # cannot happen for bytes that decoded once; say so rather than feed None
                raise ValueError(f"re-decoding the image failed: {d.error}")
            self.image = d.image
        return self.image

    def prepare_pixels(self, preps: Iterable[PixelPrep]) -> None:
        """What a decode task does for the pools (docs/architecture.md, "Pixels prepared once"): the
        decoded image resized and cropped for each geometry in ``preps``."""
        image = self.pil()
        self.pixels = {p.key: p.apply(image) for p in preps}

    def drop_image(self) -> None:
        self.image = None
        self.encoded = None
        self.pixels = {}

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (between Ray pools) without the decoded pixels when the encoded bytes are there."""
        state = dict(self.__dict__)
        if state.get("encoded") is not None:
            state["image"] = None
        return state

    def to_row(self) -> dict[str, Any]:
        row = empty_row(self.image_id, self.benchmark, self.split, self.domain, self.error)
        if self.error is None:
            row.update(
                retrieved=self.retrieved,
                verified=self.verified,
                entities=list(self.entities),
                prompt=self.prompt,
                candidates=self.candidates,
                verifier_backend=self.verifier_backend,
            )
        return row


def decode_state(image_id: str, benchmark: str, split: str, domain: str | None,
                 image_path: str | None, error: str | None = None, exif_transpose: bool = True,
                 keep_bytes: bool = True) -> ImageState:
    """A fresh state with its image decoded (or its ``error`` set: missing file, truncated JPEG, a
    path the annotation reader already refused (``error``), ...); with ``keep_bytes`` also the bytes
    it travels as (:func:`encode_for_transport`: none where every pool takes prepared pixels)."""
    s = ImageState(image_id=image_id, benchmark=benchmark, split=split, domain=domain or None)
    if error:
        s.error = f"decode: {error}"
        return s
    if not image_path:
        s.error = "decode: the record has no image path"
        return s
    data, error = read_image_file(image_path)
    if error:
        s.error = f"decode: {error}"
        return s
    d = decode_image(data, name=image_path, exif_transpose=exif_transpose)
    if d.error:
        s.error = f"decode: {d.error}"
    else:
        s.image = d.image
        s.encoded = encode_for_transport(data, d.image) if keep_bytes else None
    return s


def encode_for_transport(data: bytes, image) -> bytes:
    """What a state carries between pools: the file's own bytes when they are no larger than the
    decoded pixels (a JPEG is about a tenth of them), else a lossless PNG of the decoded image (an
    uncompressed BMP/TIFF, or a file bigger than ``max_side`` allows). Both decode to exactly the
    pixels decoded here (same decoder, same EXIF and downscaling rules), so features do not change."""
    raw = image.width * image.height * 3
    if len(data) <= raw:
        return data
    buf = io.BytesIO()
    image.save(buf, format="PNG", compress_level=1)
    return min(buf.getvalue(), data, key=len)  # noise compresses to nothing: pick the smaller

"""Image decoding to RGB where every failure is a value (``DecodedImage.error``), never an exception,
so one bad file cannot kill a batch."""

from __future__ import annotations

import io
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence, Union

import numpy as np
from PIL import Image, UnidentifiedImageError

# PIL's own bomb limit is 2 x Image.MAX_IMAGE_PIXELS (89,478,485) = 178,956,970 pixels.
DEFAULT_MAX_PIXELS = 178_956_970
DEFAULT_MAX_SIDE = 4096

Source = Union[str, Path, bytes, bytearray, memoryview]
_PIL_LIMIT_LOCK = threading.Lock()


@dataclass
class DecodedImage:
    """``image`` is an RGB PIL image or None; ``error`` says why it is None. ``width``/``height`` are
    the stored image's size (before any downscaling; 0 when unknown)."""

    image: Image.Image | None
    error: str | None
    width: int = 0
    height: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None and self.image is not None


def _to_rgb(im: Image.Image) -> Image.Image:
    mode = im.mode
    if mode == "RGB":
        return im
    if mode in ("I;16", "I;16L", "I;16B", "I;16N", "I"):
        a = np.asarray(im).astype(np.float64)
        hi = float(a.max()) if a.size else 0.0
        if mode.startswith("I;16") or hi > 255:
            a = a / 257.0  # 16-bit range -> 8-bit
        a = np.clip(np.rint(a), 0, 255).astype(np.uint8)
        return Image.fromarray(a, "L").convert("RGB")
    if mode == "F":
        a = np.asarray(im).astype(np.float64)
        a = np.nan_to_num(a)
        if a.size and float(a.max()) <= 1.0:
            a = a * 255.0
        return Image.fromarray(np.clip(np.rint(a), 0, 255).astype(np.uint8), "L").convert("RGB")
    if mode == "P":
        im = im.convert("RGBA") if "transparency" in im.info else im.convert("RGB")
        mode = im.mode
        if mode == "RGB":
            return im
    if mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = im.convert("RGBA")
        bg = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(bg, rgba).convert("RGB")
    if mode == "1":
        return im.convert("L").convert("RGB")
    return im.convert("RGB")  # L, CMYK, YCbCr, LAB, HSV, RGBX ...


def decode_image(
    source: Source,
    *,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    max_side: int | None = DEFAULT_MAX_SIDE,
    exif_transpose: bool = False,
) -> DecodedImage:
    """Decode a file path or encoded bytes to an RGB PIL image.

    Errors (as values): missing file, zero-byte file, not an image, truncated data, more than
    ``max_pixels`` pixels (decompression-bomb guard; None disables it). Images whose longer side exceeds
    ``max_side`` are downscaled to it (aspect kept; JPEGs are decoded at reduced size directly).
    Grayscale, palette, 16-bit, CMYK and alpha images become RGB (alpha composited on white).
    EXIF orientation is ignored unless ``exif_transpose`` (COCO pipelines ignore it).
    """
    name = "<bytes>"
    try:
        if isinstance(source, (bytes, bytearray, memoryview)):
            data = bytes(source)
            if not data:
                return DecodedImage(None, "empty image data (0 bytes)")
            fp: io.BytesIO | Path = io.BytesIO(data)
        else:
            p = Path(source)
            name = str(p)
            if not p.exists():
                return DecodedImage(None, f"file not found: {name}")
            if not p.is_file():
                return DecodedImage(None, f"not a file: {name}")
            if p.stat().st_size == 0:
                return DecodedImage(None, f"empty file (0 bytes): {name}")
            fp = p
        return _decode(fp, name, max_pixels, max_side, exif_transpose)
    except MemoryError:
        return DecodedImage(None, f"out of memory decoding {name}")
    except Exception as e:  # noqa: BLE001 - every failure must become a per-image error
        return DecodedImage(None, f"cannot decode {name}: {type(e).__name__}: {e}")


def _open(fp: io.BytesIO | Path, max_pixels: int | None) -> Image.Image:
    """Image.open without PIL's own global bomb limit getting in the way of ``max_pixels``."""
    pil_limit = Image.MAX_IMAGE_PIXELS
    if pil_limit is not None and (max_pixels is None or max_pixels > 2 * pil_limit):
        with _PIL_LIMIT_LOCK:
            old = Image.MAX_IMAGE_PIXELS
            Image.MAX_IMAGE_PIXELS = None
            try:
                return Image.open(fp)
            finally:
                Image.MAX_IMAGE_PIXELS = old
    return Image.open(fp)


def _decode(
    fp: io.BytesIO | Path, name: str, max_pixels: int | None, max_side: int | None, exif_transpose: bool
) -> DecodedImage:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        try:
            im = _open(fp, max_pixels)
        except UnidentifiedImageError:
            return DecodedImage(None, f"not an image (unrecognised format): {name}")
        except Image.DecompressionBombError as e:
            return DecodedImage(None, f"image too large ({e}): {name}")
        with im:
            w, h = im.size
            if w <= 0 or h <= 0:
                return DecodedImage(None, f"image has no pixels ({w}x{h}): {name}", w, h)
            if max_pixels is not None and w * h > max_pixels:
                return DecodedImage(
                    None,
                    f"image too large: {w}x{h} = {w * h:,} pixels > max_pixels {max_pixels:,} "
                    f"(decompression-bomb guard; raise max_pixels if the file is trusted): {name}",
                    w,
                    h,
                )
            if max_side is not None and max(w, h) > max_side and im.format == "JPEG":
                scale = max_side / max(w, h)
                im.draft("RGB", (max(1, int(w * scale)), max(1, int(h * scale))))
            try:
                im.load()
            except OSError as e:
                msg = str(e)
                if "truncated" in msg.lower() or "broken data stream" in msg.lower():
                    return DecodedImage(None, f"truncated image ({msg}): {name}", w, h)
                return DecodedImage(None, f"corrupt image data ({msg}): {name}", w, h)
            except (SyntaxError, ValueError) as e:
                return DecodedImage(None, f"corrupt image data ({e}): {name}", w, h)
            if exif_transpose:
                from PIL import ImageOps

                im = ImageOps.exif_transpose(im)
            rgb = _to_rgb(im)
            if max_side is not None and max(rgb.size) > max_side:
                rw, rh = rgb.size
                scale = max_side / max(rw, rh)
                rgb = rgb.resize(
                    (max(1, round(rw * scale)), max(1, round(rh * scale))), Image.Resampling.BICUBIC
                )
            if rgb is im:
                rgb = im.copy()  # detach from the file handle closed by `with`
            return DecodedImage(rgb, None, w, h)


def decode_images(
    sources: Sequence[Source],
    *,
    max_pixels: int | None = DEFAULT_MAX_PIXELS,
    max_side: int | None = DEFAULT_MAX_SIDE,
    exif_transpose: bool = False,
    workers: int = 1,
) -> list[DecodedImage]:
    """:func:`decode_image` over many sources, in order; ``workers`` > 1 decodes in threads (PIL
    releases the GIL while decoding)."""
    kw = dict(max_pixels=max_pixels, max_side=max_side, exif_transpose=exif_transpose)
    if workers <= 1 or len(sources) <= 1:
        return [decode_image(s, **kw) for s in sources]
    with ThreadPoolExecutor(max_workers=workers) as ex:
        return list(ex.map(lambda s: decode_image(s, **kw), sources))

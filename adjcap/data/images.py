"""Image decoding to RGB where every failure is a value (``DecodedImage.error``), never an exception,
so one bad file cannot kill a batch."""

from __future__ import annotations

import io
import os
import stat
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence, Union

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

# PIL's own bomb limit is 2 x Image.MAX_IMAGE_PIXELS (89,478,485) = 178,956,970 pixels.
DEFAULT_MAX_PIXELS = 178_956_970
DEFAULT_MAX_SIDE = 4096

Source = Union[str, Path, bytes, bytearray, memoryview]
_PIL_LIMIT_LOCK = threading.Lock()
_EXIF_ORIENTATION = 0x0112
# O_NONBLOCK: opening a FIFO for reading must not wait for a writer (it is refused after fstat)
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)


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
    exif_transpose: bool = True,
    name: str | None = None,
) -> DecodedImage:
    """Decode a file path or encoded bytes to an RGB PIL image (``name``: what error messages call
    encoded bytes, e.g. the file they were read from).

    Errors (as values): missing file or dangling symlink, not a regular file (a directory, a FIFO, a
    device: checked on the opened descriptor, and a FIFO is opened without waiting for a writer),
    unreadable file, zero-byte file, not an image, truncated data, more than ``max_pixels`` pixels
    (decompression-bomb guard; None disables it). Images whose longer side exceeds ``max_side`` are
    downscaled to it (aspect kept; JPEGs are decoded at reduced size directly). Grayscale, palette,
    16-bit, CMYK and alpha images become RGB (alpha composited on white). The EXIF orientation is
    applied (a phone photo stored sideways comes out upright) unless ``exif_transpose=False``.
    """
    name = name or "<bytes>"
    try:
        if isinstance(source, (bytes, bytearray, memoryview)):
            data = bytes(source)
            if not data:
                return DecodedImage(None, "empty image data (0 bytes)")
            return _decode(io.BytesIO(data), name, max_pixels, max_side, exif_transpose)
        name = str(source)
        f, error = _open_regular(name)
        if f is None:
            return DecodedImage(None, error)
        with f:
            return _decode(f, name, max_pixels, max_side, exif_transpose)
    except MemoryError:
        return DecodedImage(None, f"out of memory decoding {name}")
    except Exception as e:  # noqa: BLE001 - every failure must become a per-image error
        return DecodedImage(None, f"cannot decode {name}: {type(e).__name__}: {e}")


def read_image_file(name: str | Path) -> tuple[bytes | None, str | None]:
    """The bytes of a non-empty regular file, read with the same checks as :func:`decode_image`
    (a FIFO, a directory, a dangling symlink, an unreadable or empty file are refused):
    (data, None) or (None, why)."""
    try:
        f, error = _open_regular(str(name))
        if f is None:
            return None, error
        with f:
            return f.read(), None
    except MemoryError:
        return None, f"out of memory reading {name}"
    except OSError as e:
        return None, f"cannot read {name}: {e.strerror or e}"


_FILE_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def _open_regular(name: str) -> tuple[io.BufferedReader | None, str | None]:
    """Open ``name`` for reading if it is a non-empty regular file: (file, None), else (None, why).
    The type is checked on the opened descriptor, so the file checked is the file read."""
    try:
        fd = os.open(name, _OPEN_FLAGS)
    except FileNotFoundError:
        return None, f"file not found: {name}"
    except PermissionError:
        return None, f"cannot read (permission denied): {name}"
    except OSError as e:
        return None, f"cannot open {name}: {e.strerror or e}"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = next((k for test, k in _FILE_KINDS if test(st.st_mode)), "not a regular file")
            os.close(fd)
            return None, f"not a file ({kind}): {name}"
        if st.st_size == 0:
            os.close(fd)
            return None, f"empty file (0 bytes): {name}"
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb"), None
    except BaseException:
        os.close(fd)
        raise


def _open(fp: io.BytesIO | io.BufferedReader, max_pixels: int | None) -> Image.Image:
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
    fp: io.BytesIO | io.BufferedReader, name: str, max_pixels: int | None, max_side: int | None, exif_transpose: bool
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
            if exif_transpose and im.getexif().get(_EXIF_ORIENTATION, 1) not in (1, None):
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
    exif_transpose: bool = True,
    workers: int = 1,
) -> list[DecodedImage]:
    """:func:`decode_image` over many sources, in order; ``workers`` > 1 decodes in threads (PIL
    releases the GIL while decoding)."""
    kw = dict(max_pixels=max_pixels, max_side=max_side, exif_transpose=exif_transpose)
    if workers <= 1 or len(sources) <= 1:
        return [decode_image(s, **kw) for s in sources]
    with ThreadPoolExecutor(max_workers=workers) as ex:
        return list(ex.map(lambda s: decode_image(s, **kw), sources))

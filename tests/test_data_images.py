"""Image decoding: every bad case is a value (DecodedImage.error), never an exception."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from adjcap.data import DecodedImage, decode_image, decode_images

FIX = Path(__file__).parent / "fixtures" / "data" / "images"
REAL = FIX / "COCO_val2014_000000354533.jpg"


def _save(im: Image.Image, path: Path, **kw) -> Path:
    im.save(path, **kw)
    return path


def _png_header_only(w: int, h: int) -> bytes:
    """A PNG whose header claims w x h pixels (8-bit gray) and holds no pixel data."""

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


def test_real_coco_jpeg():
    d = decode_image(REAL)
    assert d.ok and d.error is None
    assert d.image.mode == "RGB" and d.image.size == (d.width, d.height) == Image.open(REAL).size


def test_missing_zero_byte_directory(tmp_path: Path):
    d = decode_image(tmp_path / "missing.jpg")
    assert not d.ok and d.image is None and "file not found" in d.error and "missing.jpg" in d.error
    z = tmp_path / "zero.jpg"
    z.write_bytes(b"")
    assert "0 bytes" in decode_image(z).error
    assert "not a file" in decode_image(tmp_path).error
    assert "0 bytes" in decode_image(b"").error


def test_not_an_image(tmp_path: Path):
    p = tmp_path / "notes.jpg"
    p.write_text("this is not a JPEG at all")
    d = decode_image(p)
    assert d.image is None and "not an image" in d.error and str(p) in d.error


def test_truncated_jpeg_and_png(tmp_path: Path):
    data = REAL.read_bytes()
    p = tmp_path / "trunc.jpg"
    p.write_bytes(data[: len(data) // 2])
    d = decode_image(p)
    assert d.image is None and "truncated" in d.error
    assert (d.width, d.height) == Image.open(REAL).size  # the header was readable
    rng = np.random.default_rng(0)
    png = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(png, format="PNG")
    raw = png.getvalue()
    q = tmp_path / "trunc.png"
    q.write_bytes(raw[: len(raw) // 2])
    dq = decode_image(q)
    assert dq.image is None and dq.error
    # a corrupted middle (header intact) is an error too, not an exception
    garbled = bytearray(raw)
    garbled[200:400] = b"\x00" * 200
    dg = decode_image(bytes(garbled))
    assert dg.image is None and dg.error


def test_cmyk_jpeg(tmp_path: Path):
    p = _save(Image.new("CMYK", (40, 30), (0, 255, 255, 0)), tmp_path / "cmyk.jpg", quality=95)
    assert Image.open(p).mode == "CMYK"
    d = decode_image(p)
    assert d.ok and d.image.mode == "RGB" and d.image.size == (40, 30)
    r, g, b = np.asarray(d.image).reshape(-1, 3).mean(0)
    assert r > 200 and g < 60 and b < 60  # pure red survives


def test_16bit_grayscale_png(tmp_path: Path):
    a = np.zeros((20, 30), dtype=np.uint16)
    a[:, :10] = 65535
    a[:, 10:20] = 32768
    p = _save(Image.fromarray(a), tmp_path / "g16.png")
    assert Image.open(p).mode.startswith("I")
    d = decode_image(p)
    assert d.ok and d.image.mode == "RGB"
    out = np.asarray(d.image)
    assert out[0, 0].tolist() == [255, 255, 255]
    assert abs(int(out[0, 15, 0]) - 128) <= 1
    assert out[0, 25].tolist() == [0, 0, 0]


def test_float_and_1bit_and_grayscale(tmp_path: Path):
    f = Image.fromarray(np.full((8, 8), 0.5, dtype=np.float32), "F")
    d = decode_image(_save(f, tmp_path / "f.tiff"))
    assert d.ok and abs(int(np.asarray(d.image)[0, 0, 0]) - 128) <= 1
    b = Image.new("1", (8, 8), 1)
    d = decode_image(_save(b, tmp_path / "b.png"))
    assert d.ok and np.asarray(d.image)[0, 0].tolist() == [255, 255, 255]
    g = Image.new("L", (8, 8), 77)
    d = decode_image(_save(g, tmp_path / "g.jpg", quality=100))
    px = np.asarray(d.image)[4, 4].tolist()
    assert d.ok and px[0] == px[1] == px[2] and abs(px[0] - 77) <= 2


def test_palette_and_alpha_composited_on_white(tmp_path: Path):
    p = Image.new("P", (10, 10), 0)
    p.putpalette([0, 0, 255] + [255, 0, 0] + [0] * 762)
    p.putpixel((0, 0), 1)
    p.info["transparency"] = 1
    d = decode_image(_save(p, tmp_path / "p.png", transparency=1))
    out = np.asarray(d.image)
    assert d.ok and out[0, 0].tolist() == [255, 255, 255] and out[5, 5].tolist() == [0, 0, 255]
    rgba = Image.new("RGBA", (4, 4), (255, 0, 0, 0))
    rgba.putpixel((1, 1), (0, 255, 0, 255))
    rgba.putpixel((2, 2), (0, 0, 0, 128))
    out = np.asarray(decode_image(_save(rgba, tmp_path / "a.png")).image)
    assert out[0, 0].tolist() == [255, 255, 255]
    assert out[1, 1].tolist() == [0, 255, 0]
    assert 120 <= out[2, 2, 0] <= 135  # half-transparent black on white
    la = Image.new("LA", (4, 4), (0, 0))
    assert np.asarray(decode_image(_save(la, tmp_path / "la.png")).image)[0, 0].tolist() == [255, 255, 255]


def test_decompression_bomb_is_an_error(tmp_path: Path):
    p = tmp_path / "bomb.png"
    p.write_bytes(_png_header_only(50_000, 50_000))  # 2.5 G pixels claimed, no data
    d = decode_image(p)
    assert d.image is None and "too large" in d.error
    small = _save(Image.new("RGB", (100, 100), "red"), tmp_path / "s.png")
    d = decode_image(small, max_pixels=5_000)
    assert d.image is None and "too large" in d.error and "100x100" in d.error
    assert (d.width, d.height) == (100, 100)
    assert decode_image(small, max_pixels=10_000).ok


def test_own_limit_overrides_pil_global_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # PIL alone would refuse 100x100 (> 2x1000)
    p = _save(Image.new("RGB", (100, 100), "blue"), tmp_path / "b.png")
    assert decode_image(p, max_pixels=50_000).ok
    assert decode_image(p, max_pixels=None).ok
    assert Image.MAX_IMAGE_PIXELS == 1000  # restored
    assert "too large" in decode_image(p, max_pixels=1_500).error


def test_large_images_downscaled(tmp_path: Path):
    png = _save(Image.new("RGB", (600, 400), "green"), tmp_path / "big.png")
    d = decode_image(png, max_side=100)
    assert d.ok and d.image.size == (100, 67) and (d.width, d.height) == (600, 400)
    jpg = _save(Image.new("RGB", (1000, 800), "red"), tmp_path / "big.jpg")
    d = decode_image(jpg, max_side=200)
    assert d.ok and max(d.image.size) == 200 and (d.width, d.height) == (1000, 800)
    assert decode_image(jpg, max_side=None).image.size == (1000, 800)


def test_bytes_input_and_batch_order(tmp_path: Path):
    good = _save(Image.new("RGB", (12, 9), "white"), tmp_path / "ok.png")
    sources = [REAL, tmp_path / "missing.png", good.read_bytes(), b"garbage", str(good)]
    for workers in (1, 3):
        out = decode_images(sources, workers=workers)
        assert [o.ok for o in out] == [True, False, True, False, True]
        assert all(isinstance(o, DecodedImage) for o in out)
        assert out[2].image.size == (12, 9) and out[4].image.size == (12, 9)
        assert "not an image" in out[3].error


def _rotated_photo(path: Path, orientation: int) -> Path:
    """A real JPEG stored 40 wide x 20 high, left half red and right half blue, whose EXIF says how
    to turn it for display (as a phone writes a portrait photo)."""
    a = np.zeros((20, 40, 3), np.uint8)
    a[:, :20] = (255, 0, 0)
    a[:, 20:] = (0, 0, 255)
    exif = Image.Exif()
    exif[0x0112] = orientation
    Image.fromarray(a).save(path, quality=95, exif=exif)
    return path


def test_exif_orientation_is_honoured(tmp_path: Path):
    p = _rotated_photo(tmp_path / "portrait.jpg", 6)  # 6: turn 90 degrees clockwise for display
    with Image.open(p) as raw:
        assert raw.size == (40, 20) and raw.getexif()[0x0112] == 6
    d = decode_image(p)
    assert d.ok and d.image.size == (20, 40) and (d.width, d.height) == (40, 20)
    out = np.asarray(d.image).astype(int)
    top, bottom = out[:15].mean(axis=(0, 1)), out[25:].mean(axis=(0, 1))
    assert top[0] > 200 and top[2] < 60  # the stored left (red) is the displayed top
    assert bottom[2] > 200 and bottom[0] < 60
    upside_down = decode_image(_rotated_photo(tmp_path / "flipped.jpg", 3))  # 3: turn 180 degrees
    left = np.asarray(upside_down.image)[:, :15].astype(int).mean(axis=(0, 1))
    assert upside_down.image.size == (40, 20) and left[2] > 200 and left[0] < 60
    assert decode_images([p], workers=1)[0].image.size == (20, 40)
    # opting out keeps the stored orientation
    assert decode_image(p, exif_transpose=False).image.size == (40, 20)
    # an image without an orientation tag is returned as stored
    plain = _save(Image.new("RGB", (30, 10), "red"), tmp_path / "plain.jpg")
    assert decode_image(plain).image.size == (30, 10)


def test_fifo_and_dangling_symlink_are_errors_without_blocking(tmp_path: Path):
    import os
    import threading

    fifo = tmp_path / "pipe.jpg"
    os.mkfifo(fifo)
    dangling = tmp_path / "dangling.jpg"
    dangling.symlink_to(tmp_path / "nowhere.jpg")
    out: list = []
    t = threading.Thread(target=lambda: out.extend(decode_images([fifo, dangling, REAL])), daemon=True)
    t.start()
    t.join(10)
    assert len(out) == 3, "decoding a FIFO blocked"
    assert out[0].image is None and out[0].error == f"not a file (a FIFO): {fifo}"
    assert out[1].image is None and "file not found" in out[1].error
    assert out[2].ok
    assert decode_image(tmp_path).error == f"not a file (a directory): {tmp_path}"

"""A model's image preprocessing split in two halves (docs/architecture.md, "Pixels prepared once"):

* the geometry, on the CPU, in the decode tasks: a decoded RGB image -> resized and cropped ``uint8``
  pixels [H, W, 3] (:meth:`PixelPrep.apply`, PIL only), exactly the PIL operations of the model's own
  transform (open_clip's eval transform; LAVIS's/BLIP's square resize);
* the arithmetic, in the pool, on the model's device: ``uint8`` -> float, /255, minus mean, over std
  (:func:`adjcap.models.pixels.normalized`), the same float32 operations as ``ToTensor`` + ``Normalize``.

So a GPU actor receives a few hundred KB of pixels per image instead of decoding a JPEG and resizing it
with PIL in the thread that feeds its GPU, and the pixels it computes on are the same, bit for bit, as
its own transform's (``tests/test_pixel_prep.py`` checks it against open_clip and torchvision).

Several models share the geometry (bigG-14, ViT-L/14 and IFCap's ViT-B/32 all take a 224 bicubic
shortest-side resize and centre crop): the decode task prepares each :attr:`PixelPrep.key` once.

Torch-free: the decode tasks import it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
from PIL import Image

# resampling filters by the names open_clip and the image processors use (PIL's constants)
RESAMPLE = {"nearest": 0, "lanczos": 1, "bilinear": 2, "bicubic": 3, "box": 4, "hamming": 5}
RESAMPLE_NAME = {v: k for k, v in RESAMPLE.items()}
RESIZE_MODES = ("shortest", "squash", "longest")


@dataclass(frozen=True)
class PixelPrep:
    """``height`` x ``width`` pixels made by ``resize``:

    * ``shortest``: open_clip's default: the shorter side to the target (torchvision ``Resize(int)`` on a
      square target, timm's keep-ratio resize on another), then a centre crop;
    * ``squash``: both sides to the target, ignoring the aspect ratio (LAVIS's BLIP eval transform);
    * ``longest``: the longer side to the target, then padded with ``fill`` and centre-cropped.

    ``mean`` and ``std`` belong to the device half (:func:`adjcap.models.pixels.normalized`): two models
    with the same geometry share one array (:attr:`key` leaves them out)."""

    height: int
    width: int
    resize: str = "shortest"
    resample: int = RESAMPLE["bicubic"]
    fill: int = 0
    mean: tuple[float, float, float] = (0.0, 0.0, 0.0)
    std: tuple[float, float, float] = (1.0, 1.0, 1.0)

    def __post_init__(self) -> None:
        if self.resize not in RESIZE_MODES:
            raise ValueError(f"resize mode '{self.resize}' is not one of {RESIZE_MODES}")
        if self.resample not in RESAMPLE_NAME:
            raise ValueError(f"resampling filter {self.resample} is not one of PIL's {sorted(RESAMPLE_NAME)}")

    @property
    def key(self) -> str:
        """The geometry's name (the pixels' key between pools): ``224x224-shortest-bicubic``."""
        fill = f"-fill{self.fill}" if self.resize == "longest" else ""
        return f"{self.height}x{self.width}-{self.resize}-{RESAMPLE_NAME[self.resample]}{fill}"

    def apply(self, image: Image.Image) -> np.ndarray:
        """A decoded image -> ``uint8`` [height, width, 3] (a new array)."""
        im = image if image.mode == "RGB" else image.convert("RGB")
        th, tw = self.height, self.width
        if self.resize == "squash":
            im = _resize(im, th, tw, self.resample)
        elif self.resize == "shortest" and th == tw:
            w, h = im.size
            short, long = (w, h) if w <= h else (h, w)
            new_long = int(th * long / short)  # torchvision's Resize(int) arithmetic
            nw, nh = (th, new_long) if w <= h else (new_long, th)
            im = _crop_centre(_resize(im, nh, nw, self.resample), th, tw, 0)
        else:
            # timm's keep-ratio resize as open_clip writes it (its non-square shortest mode: bicubic,
            # whatever the interpolation; longest: the configured one), then crop (or pad and crop)
            w, h = im.size
            rh, rw = h / th, w / tw
            ratio = max(rh, rw) if self.resize == "longest" else min(rh, rw)
            resample = self.resample if self.resize == "longest" else RESAMPLE["bicubic"]
            fill = self.fill if self.resize == "longest" else 0
            im = _crop_centre(_resize(im, round(h / ratio), round(w / ratio), resample), th, tw, fill)
        return np.asarray(im, dtype=np.uint8).copy()

    @classmethod
    def from_open_clip(cls, pp: Mapping[str, Any]) -> "PixelPrep | None":
        """open_clip's preprocess config (``get_model_preprocess_cfg``) -> its eval transform's halves;
        None for what it cannot mirror exactly (an image mode other than RGB)."""
        if str(pp.get("mode", "RGB")) != "RGB":
            return None
        size = pp.get("size", 224)
        h, w = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
        mode = pp.get("resize_mode") or "shortest"
        interp = pp.get("interpolation") or "bicubic"
        if mode not in RESIZE_MODES:
            return None
        return cls(h, w, mode, RESAMPLE["bilinear"] if interp == "bilinear" else RESAMPLE["bicubic"],
                   int(pp.get("fill_color", 0) or 0), _three(pp.get("mean")), _three(pp.get("std")))


def _three(x) -> tuple[float, float, float]:
    if x is None:
        raise ValueError("a preprocess config without mean/std")
    t = tuple(float(v) for v in x)
    return (t * 3)[:3] if len(t) == 1 else t  # type: ignore[return-value]


def _resize(im: Image.Image, h: int, w: int, resample: int) -> Image.Image:
    return im if im.size == (w, h) else im.resize((w, h), resample)


def _crop_centre(im: Image.Image, h: int, w: int, fill: int) -> Image.Image:
    """torchvision's ``center_crop`` / open_clip's ``center_crop_or_pad`` on a PIL image."""
    iw, ih = im.size
    if w > iw or h > ih:
        left, top = ((w - iw) // 2 if w > iw else 0), ((h - ih) // 2 if h > ih else 0)
        right, bottom = ((w - iw + 1) // 2 if w > iw else 0), ((h - ih + 1) // 2 if h > ih else 0)
        padded = Image.new("RGB", (iw + left + right, ih + top + bottom), (fill,) * 3)
        padded.paste(im, (left, top))
        im = padded
        iw, ih = im.size
        if (iw, ih) == (w, h):
            return im
    top, left = int(round((ih - h) / 2.0)), int(round((iw - w) / 2.0))
    return im.crop((left, top, left + w, top + h))

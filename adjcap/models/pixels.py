"""The device half of a model's image preprocessing (:mod:`adjcap.engine.pixel_prep` has the CPU half): the
``uint8`` pixels the decode tasks prepared -> the model's normalised float32 input, computed where the
model runs (a quarter of the float32 bytes cross to a GPU).

``normalized`` does what torchvision's ``ToTensor`` + ``Normalize`` (open_clip) and LAVIS's eval
transform do to the same pixels, in the same float32 operations, so the result is the same bit for bit."""

from __future__ import annotations

from typing import Callable, Iterator, Sequence

import numpy as np
import torch

from adjcap.engine.pixel_prep import PixelPrep


def stacked(arrays: Sequence[np.ndarray]) -> torch.Tensor:
    """Each image's ``uint8`` [H, W, 3] pixels -> one ``uint8`` CPU tensor [B, H, W, 3]."""
    return torch.from_numpy(np.stack(arrays))


def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``t`` on ``device``; a CPU tensor bound for CUDA goes through pinned (page-locked) host memory, so
    the copy is one DMA that does not wait for the host (a pageable copy is staged and synchronous)."""
    dev = torch.device(device)
    if dev.type == "cuda" and t.device.type == "cpu" and torch.cuda.is_available() and not t.is_pinned():
        t = t.pin_memory()
    return t.to(dev, non_blocking=True)


def normalized(pixels: torch.Tensor, prep: PixelPrep, device: torch.device | str) -> torch.Tensor:
    """``uint8`` [B, H, W, 3] -> float32 [B, 3, H, W] on ``device``: /255, minus ``prep.mean``, over ``prep.std``."""
    x = to_device(pixels, device).permute(0, 3, 1, 2).float().div(255)
    mean = torch.tensor(prep.mean, dtype=torch.float32, device=x.device).view(1, 3, 1, 1)
    std = torch.tensor(prep.std, dtype=torch.float32, device=x.device).view(1, 3, 1, 1)
    return x.sub_(mean).div_(std)


class Pixels:
    """A batch of prepared pixels as a model's ``encode_images`` takes them: ``uint8`` [B, H, W, 3] on
    the CPU and the geometry they were made with (:attr:`adjcap.engine.pixel_prep.PixelPrep.key`)."""

    def __init__(self, data: torch.Tensor, key: str):
        self.data, self.key = data, key

    def __len__(self) -> int:
        return int(self.data.shape[0])

    def input_for(self, prep: PixelPrep | None, device: torch.device | str, model: str) -> torch.Tensor:
        """The normalised input of a model whose own geometry is ``prep`` (refused when it is another)."""
        if prep is None or prep.key != self.key:
            want = "no prepared pixels" if prep is None else f"pixels '{prep.key}'"
            raise ValueError(f"{model} takes {want}, not '{self.key}' (the decode tasks prepared them for "
                             "another model: a bug; set ray.prepare_pixels=false to decode in the pools)")
        return normalized(self.data, prep, device)


def input_batches(images, batch_size: int, *, prep: PixelPrep | None, device: torch.device | str, name: str,
                  preprocess: Callable[[list], torch.Tensor]) -> Iterator[torch.Tensor]:
    """A model's image input as float32 batches of at most ``batch_size``, whatever it was given:
    :class:`Pixels` of its geometry ``prep`` (normalised once, on ``device``), a tensor its ``preprocess``
    made already, or PIL images (``preprocess`` on each batch). ``name`` names the model in errors."""
    if isinstance(images, Pixels):
        images = images.input_for(prep, device, name)
    if isinstance(images, torch.Tensor):
        for start in range(0, int(images.shape[0]), batch_size):
            yield images[start : start + batch_size]
        return
    items = list(images)
    for start in range(0, len(items), batch_size):
        yield preprocess(items[start : start + batch_size])


def count(images) -> int:
    """How many images ``images`` holds (:class:`Pixels`, a tensor or a sequence)."""
    return int(images.shape[0]) if isinstance(images, torch.Tensor) else len(images)

"""The decode tasks' half of a model's image transform (adjcap.engine.pixel_prep) plus the device half
(adjcap.models.pixels) equal the model's own transform bit for bit: open_clip's eval transform in each
resize mode (torchvision on PIL), LAVIS's eval transform, on images of every shape."""

import itertools

import numpy as np
import torch
from open_clip.transform import PreprocessCfg, image_transform_v2
from PIL import Image

from adjcap.models.blip_lavis import LavisEvalTransform
from adjcap.models.pixels import normalized, stacked
from adjcap.engine.pixel_prep import PixelPrep

MEAN, STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)
# (width, height): square, landscape, portrait, thin, smaller than the target, off by one, large
SHAPES = [(224, 224), (640, 480), (480, 640), (100, 37), (37, 100), (15, 15), (223, 225), (1000, 999)]


def _images():
    rng = np.random.default_rng(0)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in SHAPES]


def test_open_clip_eval_transform_in_two_halves_is_the_same_bits():
    images = _images()
    for mode, interp, size in itertools.product(("shortest", "squash", "longest"), ("bicubic", "bilinear"),
                                                (224, (224, 192), (64, 80))):
        cfg = dict(size=size, mode="RGB", mean=MEAN, std=STD, interpolation=interp, resize_mode=mode, fill_color=7)
        reference = image_transform_v2(PreprocessCfg(**cfg), is_train=False)
        prep = PixelPrep.from_open_clip(cfg)
        got = normalized(stacked([prep.apply(im) for im in images]), prep, "cpu")
        want = torch.stack([reference(im) for im in images])
        assert got.shape == want.shape and torch.equal(got, want), (mode, interp, size)


def test_lavis_eval_transform_in_two_halves_is_the_same_bits():
    images = _images() + [_images()[1].convert("L")]  # a grey image: RGB first, as LAVIS converts it
    for size, resample in ((384, Image.BICUBIC), (64, Image.BILINEAR)):
        t = LavisEvalTransform(size, resample=resample)
        got = normalized(stacked([t.pixel_prep.apply(im) for im in images]), t.pixel_prep, "cpu")
        assert torch.equal(got, t(images)["pixel_values"])


def test_geometries_shared_by_key_and_refused_when_unknown():
    a = PixelPrep.from_open_clip(dict(size=224, mean=MEAN, std=STD, interpolation="bicubic", resize_mode="shortest"))
    b = PixelPrep.from_open_clip(dict(size=(224, 224), mean=(0.5,) * 3, std=(0.5,) * 3, resize_mode="shortest"))
    assert a.key == b.key == "224x224-shortest-bicubic" and a != b  # one array, two normalisations
    assert PixelPrep.from_open_clip(dict(size=224, mode="L", mean=MEAN, std=STD)) is None
    assert PixelPrep(384, 384, "squash").key == "384x384-squash-bicubic"
    assert PixelPrep(64, 64, "longest", fill=3).key.endswith("-fill3")
    for bad in (dict(resize="crop"), dict(resample=9)):
        try:
            PixelPrep(8, 8, **bad)
        except ValueError as e:
            assert str(next(iter(bad.values()))) in str(e)
        else:
            raise AssertionError(bad)

"""Host work per image inside the GPU actors, before and after the decode tasks prepare the pixels
(issue 38 item 5; docs/architecture.md, "Pixels prepared once"), at the real job's geometries.

    python benchmarks/pixels.py [--images 64] [--json OUT]

The paper's split layout: the retriever (ViT-bigG-14: 224, shortest side, bicubic, centre crop), the
verifier (BLIP ITM large: 384 squashed, bicubic) and the captioner (IFCap's ViT-B/32: 224 as bigG) each
read the image; the scorer reuses both encodings. Before, each of those three actors decoded the JPEG
and ran its model's transform (PIL resize + ToTensor + Normalize) in the thread that feeds its GPU;
now a decode task decodes once and makes each distinct geometry once (two here), and an actor only
unpacks its ``uint8`` pixels from the batch's Arrow column and stacks them (the float arithmetic runs on
its GPU). Synthetic COCO-sized photos (640x480, smooth content, JPEG quality 90). CPU only; nothing is
asserted.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from open_clip.transform import PreprocessCfg, image_transform_v2
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adjcap.engine.transport import pack, unpack  # noqa: E402
from adjcap.data.images import decode_image  # noqa: E402
from adjcap.engine.image_state import ImageState  # noqa: E402
from adjcap.models.blip_lavis import LavisEvalTransform  # noqa: E402
from adjcap.models.pixels import normalized, stacked  # noqa: E402
from adjcap.engine.pixel_prep import PixelPrep  # noqa: E402

MEAN, STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)


def photos(n: int) -> list[bytes]:
    rng = np.random.default_rng(0)
    out = []
    for _ in range(n):
        small = rng.integers(0, 256, (24, 32, 3), dtype=np.uint8)
        im = Image.fromarray(small).resize((640, 480), Image.BICUBIC)
        noise = rng.normal(0, 6, (480, 640, 3))
        im = Image.fromarray(np.clip(np.asarray(im) + noise, 0, 255).astype(np.uint8))
        buf = io.BytesIO()
        im.save(buf, format="JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def best(fn, reps: int = 3) -> float:
    ts = []
    for _ in range(reps):
        t = time.process_time()
        fn()
        ts.append(time.process_time() - t)
    return min(ts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=64)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(1)  # one actor's feeding thread
    data = photos(args.images)
    n = len(data)
    clip_cfg = dict(size=224, mode="RGB", mean=MEAN, std=STD, interpolation="bicubic", resize_mode="shortest")
    clip_t = image_transform_v2(PreprocessCfg(**clip_cfg), is_train=False)
    blip_t = LavisEvalTransform(384)
    clip_p, blip_p = PixelPrep.from_open_clip(clip_cfg), blip_t.pixel_prep
    readers = {"retriever": (clip_t, clip_p), "verifier": (blip_t, blip_p), "captioner": (clip_t, clip_p)}

    def old_actor(transform):
        ims = [decode_image(b).image for b in data]
        if isinstance(transform, LavisEvalTransform):
            return transform(ims)["pixel_values"]
        return torch.stack([transform(im) for im in ims])

    before = {pool: best(lambda t=t: old_actor(t)) / n * 1e3 for pool, (t, _) in readers.items()}

    def decode_task():
        states = []
        for i, b in enumerate(data):
            s = ImageState(str(i), "coco", "val")
            im = decode_image(b).image
            s.pixels = {p.key: p.apply(im) for p in (clip_p, blip_p)}
            states.append(s)
        return pack(states)

    table = decode_task()
    decode_ms = best(decode_task) / n * 1e3
    jpeg_only_ms = best(lambda: [decode_image(b).image for b in data]) / n * 1e3

    def new_actor(prep, device_half: bool):
        states = unpack(table)
        u8 = stacked([s.pixels[prep.key] for s in states])
        return normalized(u8, prep, "cpu") if device_half else u8

    after = {pool: best(lambda p=p: new_actor(p, False)) / n * 1e3 for pool, (_, p) in readers.items()}
    device_half = {pool: best(lambda p=p: new_actor(p, True)) / n * 1e3 - after[pool]
                   for pool, (_, p) in readers.items()}
    # the same pixels either way (the transform's own output)
    same = all(torch.equal(normalized(stacked([s.pixels[p.key] for s in unpack(table)]), p, "cpu"), old_actor(t))
               for t, p in readers.values())
    bytes_jpeg = float(np.mean([len(b) for b in data]))
    bytes_pixels = sum(p.height * p.width * 3 for p in (clip_p, blip_p))
    res = {
        "images": n,
        "actor_host_ms_per_image_before": {k: round(v, 2) for k, v in before.items()},
        "actor_host_ms_per_image_after": {k: round(v, 2) for k, v in after.items()},
        "actor_device_half_ms_per_image_on_cpu": {k: round(v, 2) for k, v in device_half.items()},
        "actor_host_ms_per_image_total": {"before": round(sum(before.values()), 2),
                                          "after": round(sum(after.values()), 2)},
        "decode_task_ms_per_image": {"before_jpeg_only": round(jpeg_only_ms, 2), "after": round(decode_ms, 2)},
        "bytes_per_image_per_hop": {"before_jpeg": round(bytes_jpeg), "after_pixels": bytes_pixels},
        "same_input_tensors": same,
    }
    print(json.dumps(res, indent=1))
    if args.json:
        args.json.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()

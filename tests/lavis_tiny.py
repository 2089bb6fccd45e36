"""Run with the LAVIS environment's python (tests/test_lavis_backend.py does):

    build OUT.pth TOKENIZER_DIR SEED   a small LAVIS BlipITM (LAVIS's own classes, random weights) saved
                                       as {"model": state_dict} with a few retrieval-only keys added
                                       (adjcap.demo.tiny_lavis.build: the demo's tiny LAVIS judge)
    score PTH TOKENIZER_DIR SPEC.json OUT.json
                                       LAVIS ITM probabilities of SPEC {"images": [...], "captions": [[...]]}:
                                       "score" (image encoded once) and "pairs" (LAVIS forward per pair)
"""

from __future__ import annotations

import json
import sys

from PIL import Image

from adjcap.demo.tiny_lavis import build
from adjcap.models.lavis_itm import load_lavis_verifier


def score(pth: str, tokenizer: str, spec_path: str, out: str) -> None:
    spec = json.loads(open(spec_path).read())
    v = load_lavis_verifier(pth, tokenizer=tokenizer, device="cpu")
    images = [Image.open(p).convert("RGB") for p in spec["images"]]
    caps = spec["captions"]
    fast = v.score(v.encode_images(images), caps)
    flat_images = [im for im, cs in zip(images, caps) for _ in cs]
    pairs = v.score_pairs(flat_images, [c for cs in caps for c in cs])
    with open(out, "w") as f:
        json.dump({"score": [a.tolist() for a in fast], "pairs": pairs.tolist()}, f)


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    if cmd == "build":
        build(args[0], args[1], int(args[2]))
    elif cmd == "score":
        score(*args)
    else:
        raise SystemExit(f"unknown command {cmd}")

"""Run with the LAVIS environment's python (tests/test_lavis_backend.py does):

    build OUT.pth TOKENIZER_DIR SEED   a small LAVIS BlipITM (LAVIS's own classes, random weights) saved
                                       as {"model": state_dict} with a few retrieval-only keys added
    score PTH TOKENIZER_DIR SPEC.json OUT.json
                                       LAVIS ITM probabilities of SPEC {"images": [...], "captions": [[...]]}:
                                       "score" (image encoded once) and "pairs" (LAVIS forward per pair)
"""

from __future__ import annotations

import json
import sys

import torch
from PIL import Image

from adjcap.models.lavis_itm import build_lavis_itm, load_lavis_verifier

TINY = dict(vision_width=128, vision_layers=2, vision_heads=2, vision_mlp=256, patch_size=8, image_size=32,
            text_width=128, text_layers=2, text_heads=2, text_intermediate=256, max_positions=64,
            encoder_width=128, embed_dim=32)


def build(out: str, tokenizer: str, seed: int) -> None:
    from lavis.models.blip_models.blip import BlipBase

    from adjcap.models.lavis_itm import lavis_tokenizer_source

    with lavis_tokenizer_source(tokenizer):
        vocab = len(BlipBase.init_tokenizer())  # BERT vocabulary + [DEC] + [ENC]
    torch.manual_seed(seed)
    model = build_lavis_itm({**TINY, "vocab_size": vocab}, tokenizer)
    # spread the ITM head so random scores cover (0, 1) instead of sitting at 0.5
    torch.nn.init.normal_(model.itm_head.weight, std=1.0 / TINY["text_width"] ** 0.5)
    sd = model.state_dict()
    # training state a released retrieval checkpoint carries and ITM does not read
    sd["temp"] = torch.tensor(0.07)
    sd["ptr_queue"] = torch.zeros(1, dtype=torch.long)
    sd["image_queue"] = torch.randn(TINY["embed_dim"], 8)
    sd["vision_proj_m.weight"] = torch.randn_like(sd["vision_proj.weight"])
    torch.save({"model": sd}, out)


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

"""CPU seconds per image of each verifier family (``verifier.family``) at its real size: random weights,
fp32, one thread, one 400x400 image. Stage 2 = encode the image and score the L=9 retrieved captions; stage 4 =
score the N=20 beam candidates against the stage-2 memo (the verifier half of stage 4).

    python benchmarks/verifier_families.py CACHE   # CACHE: a cache holding the demo's tiny BLIP (its tokenizer)

BLIP ITM large (ViT-L/16 at 384 px + BERT-base with cross-attention), BLIP-2 ITM (ViT-g/14 at 224 px + the
Q-Former, its ITM head), SigLIP SO400M/14 at 384 px (open_clip; its text always padded to 64 tokens, as
SigLIP's tokenizer does). The loaders' own classes score (adjcap.models.blip.Verifier,
adjcap.models.blip2.Blip2Verifier; SigLIP's open_clip towers as adjcap.models.clip_verifier does).
Not a test: nothing is asserted (figures: BENCHMARKS.md; notes: docs/benchmarks/pipeline.md, "Verifier families").
"""

from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import open_clip  # noqa: E402
from transformers import (AutoTokenizer, Blip2Config, Blip2ForImageTextRetrieval, BlipConfig,  # noqa: E402
                          BlipForImageTextRetrieval)

from adjcap.demo.world import random_images  # noqa: E402
from adjcap.models.blip import Verifier  # noqa: E402
from adjcap.models.blip2 import Blip2Verifier  # noqa: E402
from adjcap.models.blip_lavis import LavisEvalTransform  # noqa: E402

torch.set_num_threads(1)
img = random_images(1, size=400, seed=1)
tiny = sys.argv[1]
caps9 = ["a man riding a wave on top of a surfboard in the ocean"] * 9
caps20 = caps9[:1] * 20
out = {}


def fill(net):
    net = net.to_empty(device="cpu")
    with torch.no_grad():
        for p in net.parameters():
            p.normal_(0, 0.02)
        for n, b in net.named_buffers():
            if "position_ids" in n:
                b.copy_(torch.arange(b.shape[-1]).expand_as(b))
    return net.eval()


def timed(name, memo_fn, score_fn):
    c = time.process_time()
    with torch.inference_mode():
        memo = memo_fn()
        score_fn(memo, caps9)
        c2 = time.process_time()
        score_fn(memo, caps20)
    c3 = time.process_time()
    out[name] = {"stage2_s": round(c2 - c, 2), "stage4_s": round(c3 - c2, 2)}
    print(name, out[name], flush=True)


tok = AutoTokenizer.from_pretrained(f"{tiny}/tiny/blip-itm")
# BLIP ITM large: ViT-L/16 at 384 + BERT-base with cross-attention (transformers' defaults for the large checkpoint)
with torch.device("meta"):
    net = BlipForImageTextRetrieval(BlipConfig(vision_config=dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24,
                                    num_attention_heads=16, image_size=384, patch_size=16), text_config=dict(vocab_size=30524)))
net = fill(net)
print("blip params", sum(p.numel() for p in net.parameters()), flush=True)
v = Verifier(net, tok, LavisEvalTransform(384), model_id="blip-large", device=torch.device("cpu"), dtype=torch.float32)
timed("blip_itm (BLIP ITM large)", lambda: v.encode_images(img), lambda m, c: v.score(m, [c]))
net = v = None
gc.collect()
with torch.device("meta"):
    net = Blip2ForImageTextRetrieval(Blip2Config(qformer_config=dict(vocab_size=30523, use_qformer_text_input=True)))
net = fill(net)
print("blip2 params", sum(p.numel() for p in net.parameters()), flush=True)
v = Blip2Verifier(net, tok, LavisEvalTransform(224), model_id="blip2", device=torch.device("cpu"), dtype=torch.float32)
timed("blip2_itm (BLIP-2 ITM ViT-g)", lambda: v.encode_images(img), lambda m, c: v.score(m, [c]))
net = v = None
gc.collect()
with torch.device("meta"):
    net = open_clip.create_model("ViT-SO400M-14-SigLIP-384", pretrained=None, device="meta")
net = fill(net)
print("siglip params", sum(p.numel() for p in net.parameters()), flush=True)
pix = torch.randn(1, 3, 384, 384)
ids = torch.randint(1, 30000, (20, 64))

def siglip_memo():
    return torch.nn.functional.normalize(net.encode_image(pix), dim=-1)

def siglip_score(m, c):
    t = torch.nn.functional.normalize(net.encode_text(ids[: len(c)]), dim=-1)
    return torch.sigmoid(net.logit_scale.exp() * t @ m.T + net.logit_bias)
timed("clip (SigLIP SO400M/14-384)", siglip_memo, siglip_score)
print(json.dumps(out))

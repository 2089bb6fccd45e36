"""The tiny IFCap the decoding tests share (tests/test_decoding_beam.py, tests/test_decode_audit.py): a GPT-2
tokenizer trained on a real caption excerpt, a tiny IFCap of the official key names, loaded through the
real loader on one thread, and random CLIP inputs with entity lists."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import torch

from adjcap.demo.tiny_ifcap import build_tiny_ifcap, train_gpt2_tokenizer
from adjcap.models.ifcap import load_ifcap

FIXTURES = Path(__file__).parent / "fixtures" / "data"
CLIP_DIM = 24
WORDS = "man woman dog cat surfboard wave beach table pizza plate bus street car tree bench park kite".split()


def tiny_captioner(root: Path) -> Iterator:
    """Yields the loaded tiny IFCap (a module fixture's body); torch runs on one thread meanwhile
    (tiny matrices: threading only adds overhead)."""
    data = json.loads((FIXTURES / "coco_test_captions.json").read_text())
    tok = train_gpt2_tokenizer([c for caps in data.values() for c in caps], root / "tok", vocab_size=400)
    pt = build_tiny_ifcap(root / "ifcap", tok, clip_dim=CLIP_DIM, seed=42)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield load_ifcap(pt, lm_config=pt.parent, tokenizer=tok, device="cpu", mapping_heads=2)
    torch.set_num_threads(threads)


def make_inputs(n: int, seed: int):
    """(image embeddings [n, CLIP_DIM], retrieved-caption embeddings [n, 5, CLIP_DIM], entity lists)."""
    g = torch.Generator().manual_seed(seed)
    rnd = random.Random(seed)
    x = torch.randn(n, CLIP_DIM, generator=g)
    r = torch.randn(n, 5, CLIP_DIM, generator=g)
    ents = [rnd.sample(WORDS, rnd.randint(0, 4)) for _ in range(n)]
    return x, r, ents

"""open_clip's tokenizer against adjcap's fast one (adjcap.models.clip_tokens): same ids, host time.

    python benchmarks/tokens.py [--captions 50000] [--json benchmarks/results/tokens.json]

* ``corpus``: captions/s tokenising a corpus (the demo world's captions, recombined into ``--captions``
  distinct COCO-like captions), as the corpus encode does before the text tower;
* ``scorer``: host ms per image for the scorer's 20 candidates per image (``DualEncoder.tokenize`` in the
  score stage, inside the GPU actor), over 500 images of distinct candidates.

Each figure is the best of 3 runs; the ids are compared (``same_ids``). Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import open_clip  # noqa: E402
import torch  # noqa: E402

from adjcap.models.clip_tokens import fast_tokenizer  # noqa: E402


def coco_like(n: int, seed: int = 0) -> list[str]:
    """``n`` distinct captions recombined from the demo world's caption words (or a fixed word list)."""
    world = Path(os.environ.get("ADJCAP_TEST_WORLD", "")) / "demo" / "annotations" / "alt_captions.txt"
    words = sorted({w for line in world.read_text().splitlines() for w in line.split()}) if world.is_file() else \
        "a man woman dog cat riding sitting on top of the table with two red white large small".split()
    rng = random.Random(seed)
    out = []
    for i in range(n):
        body = " ".join(rng.choice(words) for _ in range(rng.randint(6, 14)))
        out.append(f"{body[0].upper()}{body[1:]} {i}." if rng.random() < 0.5 else body)
    return out


def best(fn, reps: int = 3) -> float:
    t = float("inf")
    for _ in range(reps):
        s = time.perf_counter()
        fn()
        t = min(t, time.perf_counter() - s)
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--captions", type=int, default=50_000)
    ap.add_argument("--images", type=int, default=500)
    ap.add_argument("--model", default="ViT-bigG-14")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    ref = open_clip.get_tokenizer(args.model)
    fast = fast_tokenizer(ref)
    corpus = coco_like(args.captions)
    out: dict = {"command": " ".join(["python", *sys.argv]), "device": f"cpu ({platform.processor() or 'cpu'}, "
                 f"{os.cpu_count()} cores, shared)", "model": args.model, "tokenizer": type(ref).__name__}
    same = torch.equal(ref(corpus), fast(corpus))
    t_ref, t_fast = best(lambda: ref(corpus), 1), best(lambda: fast(corpus))
    out["corpus"] = {"captions": len(corpus), "same_ids": same, "before_captions_per_s": round(len(corpus) / t_ref),
                     "after_captions_per_s": round(len(corpus) / t_fast), "speedup": round(t_ref / t_fast, 1),
                     "fallbacks": fast.fallbacks}
    print("corpus", out["corpus"], flush=True)
    cands = coco_like(20 * args.images, seed=1)
    per_image = [cands[i:i + 20] for i in range(0, len(cands), 20)]
    same = all(torch.equal(ref(c), fast(c)) for c in per_image)
    t_ref = best(lambda: [ref(c) for c in per_image])
    t_fast = best(lambda: [fast(c) for c in per_image])
    out["scorer"] = {"images": len(per_image), "candidates_per_image": 20, "same_ids": same,
                     "before_host_ms_per_image": round(t_ref / len(per_image) * 1e3, 3),
                     "after_host_ms_per_image": round(t_fast / len(per_image) * 1e3, 3)}
    print("scorer", out["scorer"], flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()

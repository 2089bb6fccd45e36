"""Time the COCO caption metrics (PTB tokenisation, BLEU, METEOR, ROUGE-L, CIDEr) on 5,000 predictions.

    .venv/bin/python benchmarks/evaluate.py [--n 5000] [--source auto|shared|synthetic] [--chair]

Data: a real system's COCO Karpathy-test output with its references when the shared data folder is
beside the repo (``../shared/data``, RajGothi ViECap run, 5,000 images x 5 references), otherwise a
seeded synthetic caption set of the same shape. Target: under 2 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHARED = ROOT.parent / "shared" / "data" / (
    "RajGothi__Visual-Entities-Empowered-Zero-Shot-Image-to-Text-Generation-Transfer-Across-Domains"
) / "checkpoints" / "train_coco" / "coco_generated_captions.json"

_SUBJECTS = ["a man", "a woman", "two dogs", "a cat", "a group of people", "a young boy", "a giraffe", "a bus",
             "an elephant", "a plate of food", "a train", "a red motorcycle", "a surfer", "a kitchen"]
_VERBS = ["standing", "sitting", "riding", "walking", "parked", "eating", "holding a kite", "playing frisbee"]
_PLACES = ["on a beach", "in a field", "next to a table", "on a city street", "in the snow", "near a window",
           "in front of a building", "on top of a hill", "at the station", "in a grassy area"]


def synthetic(n: int, seed: int = 0) -> tuple[dict[str, str], dict[str, list[str]]]:
    rng = random.Random(seed)

    def cap() -> str:
        s = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_PLACES)}"
        if rng.random() < 0.4:
            s += f" with {rng.choice(_SUBJECTS)}"
        return s[0].upper() + s[1:] + "."

    refs = {f"{i}.jpg": [cap() for _ in range(5)] for i in range(n)}
    preds = {k: cap() for k in refs}
    return preds, refs


def shared(n: int) -> tuple[dict[str, str], dict[str, list[str]]]:
    rows = json.loads(SHARED.read_text())[:n]
    return {r["image_name"]: r["prediction"] for r in rows}, {r["image_name"]: r["captions"] for r in rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--source", choices=("auto", "shared", "synthetic"), default="auto")
    ap.add_argument("--chair", action="store_true", help="also time the CHAIR proxy")
    args = ap.parse_args()

    import contextlib
    import io

    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge

    from adjcap.metrics.meteor import MeteorScorer
    from adjcap.metrics.tokenizer import ptb_tokenize

    use_shared = args.source == "shared" or (args.source == "auto" and SHARED.exists())
    preds, refs = shared(args.n) if use_shared else synthetic(args.n)
    print(f"{len(preds)} predictions, {sum(map(len, refs.values()))} references "
          f"({'shared data: ViECap run on COCO Karpathy test' if use_shared else 'synthetic'})")
    times: dict[str, float] = {}
    t_all = time.perf_counter()

    t = time.perf_counter()
    gts = ptb_tokenize(refs)
    res = ptb_tokenize({k: [v] for k, v in preds.items()})
    times["PTB tokenize"] = time.perf_counter() - t

    t = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        bleu, _ = Bleu(4).compute_score(gts, res)
    times["BLEU-1..4"] = time.perf_counter() - t

    t = time.perf_counter()
    with MeteorScorer() as m:
        first = next(iter(gts))
        m.compute_score({first: gts[first]}, {first: res[first]})
        times["METEOR start (JVM + paraphrase table)"] = time.perf_counter() - t
        t = time.perf_counter()
        meteor, _ = m.compute_score(gts, res)
        times["METEOR score"] = time.perf_counter() - t

    t = time.perf_counter()
    rouge, _ = Rouge().compute_score(gts, res)
    times["ROUGE-L"] = time.perf_counter() - t

    t = time.perf_counter()
    cider, _ = Cider().compute_score(gts, res)
    times["CIDEr"] = time.perf_counter() - t

    if args.chair:
        from adjcap.metrics.chair import chair_proxy

        t = time.perf_counter()
        ch = chair_proxy(preds, refs)
        times["CHAIR proxy"] = time.perf_counter() - t
    total = time.perf_counter() - t_all

    for k, v in times.items():
        print(f"  {k:40s} {v:7.2f} s")
    print(f"  {'total':40s} {total:7.2f} s   (target < 120 s on 2 cores)")
    print(f"scores x100: B-4 {100 * bleu[3]:.1f}  METEOR {100 * meteor:.1f}  ROUGE-L {100 * rouge:.1f}  "
          f"CIDEr {100 * cider:.1f}" + (f"  CHAIR_s {ch.chair_s:.2f}%" if args.chair else ""))


if __name__ == "__main__":
    main()

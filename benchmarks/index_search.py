"""Exact top-k search of a stored fp16 caption index on the CPU, one thread (as one retriever actor
with one CPU searches), by query batch size.

    python benchmarks/index_search.py                          # 200,000 x 1280 (bigG's width), k = 20
    python benchmarks/index_search.py --rows 566747 --json out.json

Random unit vectors (the search's cost does not depend on them); the ids are checked against the
numpy brute force for the last batch. Prints ms per search and per image; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from adjcap.index.search import CaptionIndex, brute_force_topk  # noqa: E402
from adjcap.index.shards import IndexManifest  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--dim", type=int, default=1280)
    ap.add_argument("--k", type=int, default=20)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 16, 64])
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    v = torch.randn(args.rows, args.dim, generator=g)
    v16 = (v / v.norm(dim=1, keepdim=True)).half()
    del v
    index = CaptionIndex(IndexManifest("bench", "bench", args.dim, args.rows, "fp16"), v16, torch.arange(args.rows))
    out = {"rows": args.rows, "dim": args.dim, "k": args.k, "threads": 1, "machine": platform.processor() or platform.machine(),
           "torch": torch.__version__, "batches": {}}
    for b in args.batches:
        q = torch.randn(b, args.dim, generator=g)
        q = q / q.norm(dim=1, keepdim=True)
        index.search(q, args.k)  # warm
        reps = max(1, int(2.0 / max(1e-3, _time(index, q, args.k))))
        dt = min(_time(index, q, args.k) for _ in range(min(reps, 5)))
        out["batches"][b] = {"ms_per_search": 1000 * dt, "ms_per_image": 1000 * dt / b}
        print(f"batch {b:3d}: {1000 * dt:7.1f} ms per search, {1000 * dt / b:6.1f} ms per image", flush=True)
    _, ids = index.search(q, args.k)
    _, ref = brute_force_topk(q, v16.float(), np.arange(args.rows), args.k)
    print("ids equal to the brute force:", bool((ids.numpy() == ref).all()))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


def _time(index: CaptionIndex, q: torch.Tensor, k: int) -> float:
    t = time.perf_counter()
    index.search(q, k)
    return time.perf_counter() - t


if __name__ == "__main__":
    main()

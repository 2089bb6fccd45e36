"""Memory of the caption index in the retriever actors of one node: held once per node or once per actor?

    python benchmarks/index_memory.py                        # 200,000 x 1280 fp16, 4 actors, both ways
    python benchmarks/index_memory.py --rows 566747 --actors 8 --mode shared

Builds a random unit-norm index of ``--rows`` captions at bigG's width (1280) on disk (the encode job's
shard format), puts it in a local Ray's object store the way the job does, starts ``--actors`` actors on
this one node that open it and search it once, and reads each actor's memory from /proc/PID/smaps_rollup:

* USS (private pages: what this actor alone costs), PSS (shared pages split among their users), RSS;
* ``resident_gib_per_node``: the node's retriever actors' USS summed, plus the shared object once
  (what the node holds for its retriever pool, beyond each actor's own models and runtime).

Modes: ``shared`` is what the job does (:class:`adjcap.index.SharedIndex`, zero-copy read-only views of
the object store); ``copy`` is what the job did before (each actor ``ray.get`` the tuple and builds its
own fp32 index and Python list of texts), kept here as the comparison. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

DIM = 1280  # ViT-bigG-14's embedding width
GIB = float(2**30)


def smaps(pid: int | str = "self") -> dict[str, int]:
    """USS, PSS and RSS of a process in bytes (Linux /proc/PID/smaps_rollup)."""
    vals: dict[str, int] = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3 and parts[2] == "kB":
                vals[parts[0].rstrip(":")] = int(parts[1]) * 1024
    return {"uss": vals.get("Private_Clean", 0) + vals.get("Private_Dirty", 0), "pss": vals.get("Pss", 0),
            "rss": vals.get("Rss", 0)}


def demo_texts(n: int) -> list[str]:
    """``n`` captions: the demo world's corpus (``$ADJCAP_TEST_WORLD`` or the default cache) cycled, each
    with its row number so that they differ (deterministic)."""
    from adjcap.demo.world import demo_corpus_texts

    world = Path(os.environ.get("ADJCAP_TEST_WORLD") or Path.home() / ".cache" / "adjcap") / "demo"
    base = demo_corpus_texts(world)
    return [f"{base[i % len(base)][:-1]}, number {i}." for i in range(n)]


def build_random_index(out: Path, rows: int, seed: int = 0) -> Path:
    """A finished index of ``rows`` random unit vectors [rows, 1280], written in 65,536-row shards."""
    from adjcap.index import build_index

    rng = np.random.default_rng(seed)

    def batches():
        for s in range(0, rows, 65536):
            yield rng.standard_normal((min(65536, rows - s), DIM), dtype=np.float32)

    build_index(out, batches(), encoder_id="random-1280", corpus_fingerprint=f"random-{rows}")
    return out


class Probe:
    """Opens the index as a retriever actor does (``mode``), searches once, reports its memory."""

    def __init__(self, refs: list, mode: str):
        import ray
        import torch

        from adjcap.index import CaptionIndex

        torch.set_num_threads(1)
        if mode == "copy":  # the job before: every actor its own fp32 copy and its own list of texts
            vectors, ids, precision, self.texts = ray.get(refs[0])
            self.index = CaptionIndex.from_arrays(vectors, ids, device="cpu", precision=precision)
        else:
            shared = ray.get(refs[0])
            self.index, self.texts = shared.open("cpu"), shared.texts
        q = torch.nn.functional.normalize(torch.randn(8, DIM), dim=-1)
        _, ids = self.index.search(q, 5)
        self.first = self.texts[int(ids[0, 0])]

    def memory(self) -> dict:
        import resource

        return {"pid": os.getpid(), **smaps(), "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def measure(index_dir: Path, texts: list[str], actors: int, mode: str) -> dict:
    """In a running Ray: put the index as the job does, start ``actors`` probes one after another
    (one transient load at a time), return their memory and the node's resident total."""
    import ray

    from adjcap.index import index_arrays, shared_index

    if mode == "copy":
        vectors, ids, precision = index_arrays(index_dir)
        payload = (vectors.astype(np.float16) if precision == "fp16" else vectors, ids, precision, texts)
        shared_bytes = vectors.nbytes + ids.nbytes
    else:
        payload = shared_index(index_dir, texts)
        shared_bytes = payload.nbytes
    ref = ray.put(payload)
    del payload
    probe = ray.remote(num_cpus=0)(Probe)
    handles, mems = [], []
    t0 = time.perf_counter()
    for _ in range(actors):
        h = probe.remote([ref], mode)  # in a list: a top-level ref would arrive as its value
        handles.append(h)
        mems.append(ray.get(h.memory.remote()))
    mems = [ray.get(h.memory.remote()) for h in handles]  # again, all of them alive together
    wall = time.perf_counter() - t0
    for h in handles:
        ray.kill(h)
    uss = sum(m["uss"] for m in mems)
    return {
        "mode": mode, "actors": actors, "wall_s": round(wall, 1),
        "object_gib": round(shared_bytes / GIB, 3),
        "uss_gib": [round(m["uss"] / GIB, 3) for m in mems],
        "pss_gib": [round(m["pss"] / GIB, 3) for m in mems],
        "rss_gib": [round(m["rss"] / GIB, 3) for m in mems],
        "peak_rss_gib": [round(m["peak_rss"] / GIB, 3) for m in mems],
        # every actor's private pages + the object once (in copy mode the object is freed after the loads)
        "resident_gib_per_node": round((uss + (shared_bytes if mode == "shared" else 0)) / GIB, 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--actors", type=int, default=4)
    ap.add_argument("--mode", choices=("both", "copy", "shared"), default="both")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    import ray

    texts = demo_texts(args.rows)
    with tempfile.TemporaryDirectory() as tmp:
        index_dir = build_random_index(Path(tmp) / "index", args.rows)
        store = int(1.5 * args.rows * (DIM * 2 + 8 + 80)) + (256 << 20)
        ray.init(address="local", num_cpus=max(2, args.actors), object_store_memory=store,
                 include_dashboard=False, log_to_driver=False)
        results = []
        try:
            for mode in (("copy", "shared") if args.mode == "both" else (args.mode,)):
                r = measure(index_dir, texts, args.actors, mode)
                results.append(r)
                print(f"{mode:6s} {args.rows:,} x {DIM} fp16 index, {args.actors} actors on one node: "
                      f"USS/actor {max(r['uss_gib']):.2f} GiB, PSS/actor {max(r['pss_gib']):.2f} GiB, "
                      f"RSS/actor {max(r['rss_gib']):.2f} GiB, peak RSS/actor {max(r['peak_rss_gib']):.2f} GiB, "
                      f"object {r['object_gib']:.2f} GiB -> resident per node {r['resident_gib_per_node']:.2f} GiB")
        finally:
            ray.shutdown()
    if args.json:
        args.json.write_text(json.dumps({"rows": args.rows, "dim": DIM, "results": results}, indent=1))


if __name__ == "__main__":
    main()

"""Bytes per image per hop between split pools: everything carried (before) against what the later pools
read (after: adjcap.engine.transport.kept_for, the job's ``keep``).

    python benchmarks/transport_bytes.py [--images 6] [--json benchmarks/results/transport-bytes.json]

* ``demo``: the demo world's images through the four split pools in this process (the tiny models), the
  Arrow IPC bytes of each pool's output batch per image, packed both ways (the features are the same:
  tests/test_transport.py);

The scorer declares every image tower it may run when an image lost its stage-1 embedding or stage-2
encoding (stage_registry._pixels_scorer), and that it reads those pixels only for such an image
(stage_registry._spare_scorer): an image that carries both drops them after the last pool that reads them
unconditionally. On the demo every model reads one geometry (64x64), so only the captioner's output drops
its pixels; at real size the verifier's output drops bigG's and BLIP's geometries too (~0.6 MB an image).

Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pyarrow as pa  # noqa: E402

from adjcap.engine import stage_registry  # noqa: E402
from adjcap.engine import transport  # noqa: E402
from adjcap.config import load_config  # noqa: E402
from adjcap.engine.cluster_plan import PoolPlan  # noqa: E402
from adjcap.engine.executor import decode_pixels  # noqa: E402
from adjcap.jobs.extract_features import pools  # noqa: E402

def ipc_bytes(table: pa.Table) -> int:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().size


def split(cfg):
    return cfg.model_copy(update={"ray": cfg.ray.model_copy(update={"pools": "split"})})


def demo(n: int, cache: str) -> list[dict]:
    from adjcap.actors.decode import decode_batch
    from adjcap.jobs.demo import prepare
    from adjcap.engine.pipeline import load_models
    from adjcap.engine.run_plan import read_records

    cfg = load_config("demo", [f"paths.cache_dir={cache}", "device=cpu"])
    prepare(cfg)
    cfg = split(cfg.resolved())
    m = vars(load_models(cfg))
    recs = read_records(cfg)["test"][:n]
    runs = pools(PoolPlan.of(cfg))
    preps, keep_bytes = decode_pixels(cfg, runs)
    records = transport.records({"image_id": [r.image_id for r in recs], "benchmark": [cfg.benchmark] * n,
                                 "split": [r.split for r in recs], "domain": [r.domain for r in recs],
                                 "error": [None] * n, "image_path": [r.image_path for r in recs]})
    states = transport.unpack(decode_batch(records, None, preps, keep_bytes))
    out = []
    for run in runs:
        for name in run.meters:
            stage_registry.stage(name).run(states, m, cfg)
        last = run.kwargs["last"]
        before = ipc_bytes(transport.pack(states, drop_image=last))
        after_t = transport.pack(states, drop_image=last, keep=run.kwargs["keep"])
        out.append({"after_pool": run.pool, "before_bytes_per_image": before // n,
                    "after_bytes_per_image": ipc_bytes(after_t) // n, "keep": str(run.kwargs["keep"])})
        states = transport.unpack(after_t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=6)
    ap.add_argument("--cache", default=None, help="a cache holding the demo world (default: a temp dir linking "
                    "$ADJCAP_TEST_WORLD's)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    cache = args.cache
    if cache is None:
        cache = tempfile.mkdtemp(prefix="transport-bytes-")
        world = os.environ.get("ADJCAP_TEST_WORLD")
        for sub in ("demo", "tiny"):
            if world and (Path(world) / sub).is_dir():
                (Path(cache) / sub).symlink_to(Path(world) / sub, target_is_directory=True)
    res = {"command": " ".join(["python", *sys.argv]), "device": "cpu (no GPU: bytes do not depend on it)",
           "demo_split": demo(args.images, cache)}
    for k in ("demo_split",):
        print(k)
        for hop in res[k]:
            print(f"  after {hop['after_pool']:10s} {hop['before_bytes_per_image']:>10,d} -> "
                  f"{hop['after_bytes_per_image']:>10,d} bytes/image")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""How much stage work a table saves when its rows share their stage outputs.

    python benchmarks/reproduce_sharing.py                       # ablation on the demo world, --limit 4
    python benchmarks/reproduce_sharing.py --table protocols --limit 8

Runs `adjcap reproduce TABLE --benchmark demo` twice into fresh run and stage directories: with
stage sharing (a cold stage cache) and with ``cache.share_stages=false``, and prints the images each
stage processed (summed over the table's runs) and the wall time. Not a test: nothing is asserted.
The demo world and tiny models are built in {cache} ($ADJCAP_CACHE) on first use.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adjcap.engine.stage_registry import names as stage_names  # noqa: E402
from adjcap.jobs import reproduce  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--table", default="ablation")
    ap.add_argument("--limit", type=int, default=4)
    ap.add_argument("--workers", type=int, default=1)
    args = ap.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="adjcap-share-") as tmp:
        for mode, share in (("shared", True), ("not shared", False)):
            root = Path(tmp) / mode.replace(" ", "-")
            sets = [f"cache.stages_dir={root / 'stages'}", f"cache.share_stages={'true' if share else 'false'}",
                    "ray.include_dashboard=false"]
            t0 = time.time()
            doc = reproduce.main(args.table, "demo", sets, {"limit": args.limit, "ray.workers": args.workers},
                                 root / "runs")
            results[mode] = (doc["stage_work"]["computed"], time.time() - t0, doc["runs"],
                             doc["stage_work"]["extract_seconds"])
    print(f"\n{args.table} on the demo world, --limit {args.limit} (images per split), {results['shared'][2]} runs")
    print("| stage | images computed, shared | not shared | saved |")
    print("|---|---:|---:|---:|")
    for s in stage_names():
        a, b = results["shared"][0][s], results["not shared"][0][s]
        print(f"| {s} | {a} | {b} | {100 * (1 - a / b) if b else 0:.0f}% |")
    a = sum(results["shared"][0].values())
    b = sum(results["not shared"][0].values())
    print(f"| all stages | {a} | {b} | {100 * (1 - a / b) if b else 0:.0f}% |")
    print(f"wall time: shared {results['shared'][1]:.0f} s, not shared {results['not shared'][1]:.0f} s; "
          f"feature extraction: shared {results['shared'][3]:.0f} s, not shared {results['not shared'][3]:.0f} s")


if __name__ == "__main__":
    main()

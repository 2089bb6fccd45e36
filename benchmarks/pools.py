"""Split and fused pools on the demo (adjcap.engine.pools): the same feature job with ``ray.pools=split`` and
``ray.pools=fused``, each in a subprocess with its own embedded local Ray.

    python benchmarks/pools.py --limit 20 --workers 1 --json benchmarks/results/pools.json

Per layout: the job's wall time, the CPU seconds of every process below the job (driver, Ray's own
processes, decode tasks, pool actors; sampled from /proc every 0.2 s) per image, the peak anonymous
RSS of each pool actor process, and how many pool actors started (each imports torch and loads its
models: ~10 CPU-s on the demo). The demo world and its index are built first (not timed); every stage
is computed by the pools (``cache.share_stages=false``). Nothing is asserted; the figures go to
BENCHMARKS.md by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.realsize import descendants, proc_cpu_seconds, proc_rss  # noqa: E402

ACTOR = re.compile(r"MapBatches\((\w+Actor)\)")


class Sampler(threading.Thread):
    """CPU seconds of every process below ``root`` (the last value seen per pid) and the peak RSS of
    each pool actor process, by its class name in the process title."""

    def __init__(self, root: int, every: float = 0.2):
        super().__init__(daemon=True)
        self.root, self.every = root, every
        self.cpu: dict[int, float] = {}
        self.actors: dict[int, str] = {}
        self.peak: dict[int, int] = {}
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            for pid, cmd in [(self.root, "driver"), *descendants(self.root)]:
                try:
                    self.cpu[pid] = proc_cpu_seconds(pid)
                    m = ACTOR.search(cmd)
                    if m:
                        self.actors[pid] = m.group(1)
                        self.peak[pid] = max(self.peak.get(pid, 0), proc_rss(pid))
                except (OSError, ValueError, IndexError):
                    continue
            self._halt.wait(self.every)

    def stop(self) -> None:
        self._halt.set()
        self.join()


def run_job(layout: str, limit: int, workers: int, cache: Path, out: Path, env: dict) -> dict:
    run_dir = out / layout
    cmd = [sys.executable, str(ROOT / "cli.py"), "run-job", "demo", "--workers", str(workers), "--limit", str(limit),
           "--no-evaluate", "--fresh", "--run-dir", str(run_dir), "--set", f"paths.cache_dir={cache}",
           "--set", "cache.share_stages=false", "--set", f"ray.pools={layout}",
           "--set", "ray.include_dashboard=false"]
    t = time.time()
    log = out / f"{layout}.log"
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, text=True)
        mon = Sampler(proc.pid)
        mon.start()
        proc.wait()
    wall = time.time() - t
    mon.stop()
    text = log.read_text()
    if proc.returncode != 0:
        raise SystemExit(f"{layout}: run-job failed (exit {proc.returncode}):\n{text[-4000:]}")
    images = 2 * limit  # the demo's two splits
    per_actor: dict[str, list[int]] = {}
    for pid, name in mon.actors.items():
        per_actor.setdefault(name, []).append(mon.peak.get(pid, 0))
    feat = re.search(r"throughput: ([\d.]+) images/s over ([\d.]+)s", text)
    return {
        "layout": layout, "images": images, "workers": workers, "wall_s": round(wall, 1),
        "features_s": float(feat.group(2)) if feat else None,
        "cpu_s": round(sum(mon.cpu.values()), 1),
        "cpu_s_per_image": round(sum(mon.cpu.values()) / images, 2),
        "actor_starts": len(mon.actors),
        "actors": {k: len(v) for k, v in sorted(per_actor.items())},
        "peak_rss_mib": {k: round(max(v) / 2**20) for k, v in sorted(per_actor.items())},
        "peak_rss_all_actors_mib": round(sum(mon.peak.values()) / 2**20),
        "pools_line": next((ln for ln in text.splitlines() if ln.startswith("pools: ")), None),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=20, help="images per split (the demo has two splits)")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--layouts", nargs="+", default=["split", "fused"], choices=["split", "fused"])
    ap.add_argument("--cache", type=Path, default=None, help="a cache holding the demo world (default: a new one)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    from adjcap.config import load_config
    from adjcap.jobs.demo import prepare
    from adjcap.engine.pipeline import load_models

    out = Path(tempfile.mkdtemp(prefix="adjcap-pools-"))
    cache = args.cache or out / "cache"
    cfg = load_config("demo", [f"paths.cache_dir={cache}"])
    prepare(cfg)
    load_models(cfg)  # the demo index, built here so that no job encodes the corpus
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    results = [run_job(layout, args.limit, args.workers, cache, out, env) for layout in args.layouts]
    for r in results:
        print(json.dumps(r))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"device": f"{os.cpu_count()} CPUs", "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""The whole job at the real job's shapes with the demo's tiny models, through the real CLI on Ray.

    python benchmarks/scale.py --images 1500 --corpus 200000 --json scale.json
    python benchmarks/scale.py                                   # the real shape: 5,000 + 5,000, 566,747
    python benchmarks/scale.py --sweep --json sweep.json         # N in {500, 1500, 5000} x M in {50k, 566,747}

What it builds, under ``--work`` (default ``$ADJCAP_CACHE/scale``; reused when present):

* a demo world of ``--images`` test and as many val scenes (new scenes of the demo world generator,
  deterministic) and ``--corpus`` captions (``ceil(M / 5)`` captioned training scenes, 5 each);
* the demo's retrieval CLIP with its two projections zero-padded to 1280 columns (ViT-bigG-14's width):
  every embedding, and so every retrieval, equals the demo's, but the index has the real size in
  memory and on disk (M x 1280 fp16);
* a benchmark ``scale`` over that world (``--set benchmarks.scale.*``) with the demo preset's models.

Then, each a ``python cli.py ...`` subprocess on an embedded local Ray: ``encode-corpus``, ``run-job
--no-evaluate`` (features), ``fit`` (fit and predict), ``evaluate``, ``report``. A sampler reads /proc
every 0.5 s for the subprocess and everything below it (the raylet and Ray's workers, METEOR's Java):

* ``wall_s``, ``cpu_s`` (every process of the phase), throughput (images or captions per second);
* ``driver_peak_rss_gib``: the CLI process; ``peak_rss_gib``: the phase's whole process tree at its peak;
* per pool (the actor's process title names it): actors, peak RSS of one actor, peak of the pool summed
  (all on this one node), CPU seconds and ``busy`` = CPU s / (actors x wall);
* ``framework_cpu_s``: CPU of the driver and of Ray's own processes (raylet, GCS, idle workers), not of
  the pools' actors or the decode tasks; ``framework_ms_per_image`` is that over the features phase per
  image: what would cap a GPU run, where the actors' compute shrinks and this does not;
* ``driver_ms_per_image``: the driver process's own CPU (all its threads) while it extracted features
  (``driver_cpu_s`` of the run's ``features/summary.json``, taken by the job itself around feature
  extraction, so the CLI's start and Ray's start do not count) per image, and by thread
  (``driver_ms_per_image_by_thread``: ``driver_cpu_s_by_thread`` of the same summary);
* ``index_resident_gib_per_node``: the retriever actors' private memory summed plus the shared pages of
  the index once (adjcap.index.shared), at the phase's peak;
* ``bytes_written``: growth of the run directory and the index; ``spilled_bytes``: what Ray reports.

RSS here is ``RssAnon + RssShmem`` per process (shared object-store pages count in each process that
touches them; the per-node index figure counts them once). Nothing is asserted; figures go to
BENCHMARKS.md by hand. The machine is printed with the results.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.realsize import POOL_OF_ACTOR, descendants, proc_cpu_seconds, proc_rss  # noqa: E402

GIB = float(2**30)
WIDTH = 1280  # ViT-bigG-14's embedding width
COCO_CORPUS = 566_747
BENCH = "scale"
BATCH = 16  # ray.batch_size of a real run without GPUs (unset: 16 without GPUs, 64 with)
SWEEP_N = (500, 1500, 5000)
SWEEP_M = (50_000, COCO_CORPUS)


# --------------------------------------------------------------------------------------------
# Inputs: world, wide encoder, config overrides
# --------------------------------------------------------------------------------------------


def model_cache(work: Path) -> Path:
    """A cache with the demo's tiny models: ``$ADJCAP_TEST_WORLD`` (shared, read only) or built once
    under ``work/base`` (``jobs.demo.prepare``)."""
    shared = os.environ.get("ADJCAP_TEST_WORLD")
    if shared and (Path(shared) / "tiny" / "READY.json").is_file():
        return Path(shared)
    from adjcap.config import load_config
    from adjcap.jobs.demo import prepare

    base = work / "base"
    prepare(load_config("demo", [f"paths.cache_dir={base}"]))
    return base


def build_inputs(work: Path, n: int, m: int) -> tuple[Path, Path]:
    """(cache dir, world dir) for N images per split and a corpus of about M captions."""
    from adjcap.demo.world import build_demo_world

    cache = work / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    models = model_cache(work)
    for sub in ("tiny", "demo"):  # the tiny models and the demo lexicon (the preset's {cache}/... paths)
        link = cache / sub
        if not link.exists():
            link.symlink_to(models / sub, target_is_directory=True)
    world = work / f"world-{n}-{m}"
    build_demo_world(world, seed=42, n_test=n, n_val=n, n_corpus_images=math.ceil(m / 5))
    widen_encoder(models / "tiny" / "retrieval-clip", cache / "retrieval-clip-1280")
    return cache, world


def widen_encoder(src: Path, out: Path) -> Path:
    """The retrieval CLIP with ``text_projection`` and ``visual.proj`` zero-padded to WIDTH columns:
    the same unit embeddings (the new coordinates are 0), an index WIDTH wide."""
    import torch
    from safetensors.torch import load_file, save

    from adjcap.storage.io import atomic_write_bytes, atomic_write_json

    weights = out / "open_clip_model.safetensors"
    if weights.is_file():
        return weights
    state = load_file(str(src / "open_clip_model.safetensors"))
    for key in ("text_projection", "visual.proj"):
        w = state[key]
        state[key] = torch.cat([w, torch.zeros(w.shape[0], WIDTH - w.shape[1], dtype=w.dtype)], dim=1).contiguous()
    cfg = json.loads((src / "open_clip_config.json").read_text())
    cfg["model_cfg"]["embed_dim"] = WIDTH
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "open_clip_config.json", cfg)
    atomic_write_bytes(weights, save(state))
    return weights


def overrides(cache: Path, world: Path, workers: int, batch_size: int = BATCH, pools: str = "auto") -> list[str]:
    """The run's settings: the demo preset's models on the scale world, with the headline's Ray batch
    and ``numerics = "fast"`` (a real run's: the demo's portable mode computes one image at a time, so
    that its figures are the same on every CPU, and would measure that instead of the job's speed)."""
    ann = world / "annotations"
    sets = {
        "paths.cache_dir": cache, "paths.runs_dir": cache / "runs",
        f"benchmarks.{BENCH}.format": "ifcap", f"benchmarks.{BENCH}.images": world / "images",
        f"benchmarks.{BENCH}.annotations": ann / "test_captions.json",
        f"benchmarks.{BENCH}.annotations_by_split.test": ann / "test_captions.json",
        f"benchmarks.{BENCH}.annotations_by_split.val": ann / "val_captions.json",
        f"benchmarks.{BENCH}.corpus": ann / "train_captions.json",
        "retrieval.encoder.pretrained": cache / "retrieval-clip-1280" / "open_clip_model.safetensors",
        "retrieval.index_precision": "fp16", "retrieval.shard_size": 16384,
        "cache.share_stages": "false", "ray.workers": workers, "ray.batch_size": batch_size, "numerics": "fast",
        "ray.pools": pools,
    }
    out = []
    for k, v in sets.items():
        out += ["--set", f"{k}={v}"]
    return out


# --------------------------------------------------------------------------------------------
# Measuring one phase
# --------------------------------------------------------------------------------------------


# roles a process keeps once seen: its title says "ray::IDLE" between tasks and at exit
STICKY = {*POOL_OF_ACTOR.values(), "decode"}


def classify(cmd: str) -> str:
    for actor, pool in POOL_OF_ACTOR.items():
        if actor in cmd:
            return pool
    if "decode_batch" in cmd:
        return "decode"
    if "java" in cmd.split(" ", 1)[0]:
        return "java"
    return "ray"  # raylet, GCS, dashboard agents, idle workers, Ray Data's own tasks


def mem(pid: int) -> tuple[int, int]:
    """(private, shared object-store) resident bytes of a process."""
    return proc_rss(pid, "RssAnon"), proc_rss(pid, "RssShmem")


class Sampler(threading.Thread):
    """Peaks and CPU seconds of a phase's process tree, by role (driver, pools, decode, ray, java)."""

    def __init__(self, root: int, every: float = 0.5):
        super().__init__(daemon=True)
        self.root, self.every, self.halt = root, every, threading.Event()
        self.cpu: dict[int, tuple[str, float]] = {}
        self.driver_peak = self.tree_peak = self.index_node_peak = 0
        self.pool_actor_peak: dict[str, int] = {}
        self.pool_sum_peak: dict[str, int] = {}
        self.pool_pids: dict[str, set[int]] = {}

    def sample(self) -> None:
        tree = 0
        pools: dict[str, int] = {}
        retr_private, retr_shared = 0, 0
        procs = [(self.root, "driver")] + [(p, classify(c)) for p, c in descendants(self.root)]
        for pid, role in procs:
            known = self.cpu.get(pid, ("",))[0]
            if known in STICKY:  # an actor keeps its pool (a decoding worker its role) when its title changes
                role = known
            try:
                private, shared = mem(pid)
                self.cpu[pid] = (role, proc_cpu_seconds(pid))
            except (OSError, ValueError, IndexError):
                continue
            tree += private + shared
            if role == "driver":
                self.driver_peak = max(self.driver_peak, private + shared)
            elif role in POOL_OF_ACTOR.values():
                pools[role] = pools.get(role, 0) + private + shared
                self.pool_actor_peak[role] = max(self.pool_actor_peak.get(role, 0), private + shared)
                self.pool_pids.setdefault(role, set()).add(pid)
                if role in ("retriever", "fused"):  # the actors that hold the index
                    retr_private += private
                    retr_shared = max(retr_shared, shared)
        self.tree_peak = max(self.tree_peak, tree)
        self.index_node_peak = max(self.index_node_peak, retr_private + retr_shared)
        for role, v in pools.items():
            self.pool_sum_peak[role] = max(self.pool_sum_peak.get(role, 0), v)

    def run(self) -> None:
        while not self.halt.is_set():
            self.sample()
            self.halt.wait(self.every)

    def stop(self) -> dict[str, float]:
        self.halt.set()
        self.join()
        cpu: dict[str, float] = {}
        for role, s in self.cpu.values():
            cpu[role] = cpu.get(role, 0.0) + s
        return cpu


def du(*paths: Path) -> int:
    total = 0
    for p in paths:
        if p.is_file():
            total += p.stat().st_size
        elif p.is_dir():
            total += sum(f.stat().st_size for f in p.rglob("*") if f.is_file() and not f.is_symlink())
    return total


def run_phase(name: str, args: list[str], env: dict, watch: list[Path], count: int, unit: str,
              log_dir: Path) -> dict:
    """``python cli.py ARGS`` measured; raises with its output's tail when it fails."""
    before = du(*watch)
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, str(ROOT / "cli.py"), *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sampler = Sampler(proc.pid)
    sampler.start()
    out = proc.communicate()[0]
    wall = time.perf_counter() - t0
    cpu = sampler.stop()
    (log_dir / f"{name}.log").write_text(out)
    if proc.returncode != 0:
        raise RuntimeError(f"phase {name} failed (exit {proc.returncode}); see {log_dir / f'{name}.log'}:\n"
                           + "\n".join(out.splitlines()[-15:]))
    spilled = sum(float(x) for x in re.findall(r"Spilled (\d+(?:\.\d+)?) MiB", out)) * 2**20
    pools = {}
    for pool, pids in sampler.pool_pids.items():
        p_cpu = sum(s for pid, (role, s) in sampler.cpu.items() if role == pool)
        pools[pool] = {"actors": len(pids), "peak_rss_gib_per_actor": sampler.pool_actor_peak[pool] / GIB,
                       "peak_rss_gib_per_node": sampler.pool_sum_peak[pool] / GIB, "cpu_s": p_cpu,
                       "busy": p_cpu / max(len(pids) * wall, 1e-9)}
    framework = cpu.get("driver", 0.0) + cpu.get("ray", 0.0)
    return {
        "wall_s": wall, "cpu_s": sum(cpu.values()), "cpu_s_by_role": cpu, f"{unit}_per_s": count / wall,
        "count": count, "unit": unit, "driver_peak_rss_gib": sampler.driver_peak / GIB,
        "peak_rss_gib": sampler.tree_peak / GIB, "pools": pools, "framework_cpu_s": framework,
        "index_resident_gib_per_node": sampler.index_node_peak / GIB if {"retriever", "fused"} & set(pools) else None,
        "bytes_written": du(*watch) - before, "spilled_bytes": spilled,
    }


# --------------------------------------------------------------------------------------------
# One shape, the sweep
# --------------------------------------------------------------------------------------------


def count_rows(run_dir: Path) -> tuple[int, int]:
    from adjcap.storage.rundir import RunDir

    rows, unique = 0, set()
    for split in ("test", "val"):
        ids = RunDir(run_dir).read_features(BENCH, split, columns=["image_id"]).column("image_id").to_pylist()
        rows += len(ids)
        unique.update((split, i) for i in ids)
    return rows, len(unique)


def one(work: Path, n: int, m: int, workers: int, fresh: bool, batch_size: int, pools: str = "auto",
        features_only: bool = False, extra: tuple[str, ...] = (), warm: bool = False) -> dict:
    t0 = time.perf_counter()
    cache, world = build_inputs(work, n, m)
    world_s = time.perf_counter() - t0
    from adjcap.data.corpus import load_corpus

    corpus_n = len(load_corpus(world / "annotations" / "train_captions.json", fmt="ifcap").texts)
    run_dir = work / "runs" / f"scale-{n}-{m}-w{workers}-{pools}"
    if (fresh or warm) and run_dir.exists():
        shutil.rmtree(run_dir)
    index_root = cache / "index"
    if fresh and not warm:  # an empty cache: no index, no remembered pixel geometries (adjcap.engine.pixel_memo)
        for d in [*index_root.glob("*"), cache / "pixels"]:
            shutil.rmtree(d, ignore_errors=True)
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    sets = overrides(cache, world, workers, batch_size, pools) + [a for kv in extra for a in ("--set", kv)]
    logs = work / "logs" / run_dir.name
    logs.mkdir(parents=True, exist_ok=True)
    images = 2 * n
    phases = {}
    steps = [
        ("encode", ["encode-corpus", "--benchmark", BENCH, "--preset", "demo", *sets], corpus_n, "captions"),
        ("features", ["run-job", BENCH, "--preset", "demo", "--run-dir", str(run_dir), "--no-evaluate", *sets],
         images, "images"),
        ("fit", ["fit", "--run", str(run_dir)], images, "images"),
        ("evaluate", ["evaluate", "--run", str(run_dir), "--no-spice"], n, "images"),
        ("report", ["report", "--run", str(run_dir)], n, "images"),
    ]
    if features_only:
        steps = steps[:2]
    for name, args, count, unit in steps:
        phases[name] = r = run_phase(name, args, env, [run_dir, index_root], count, unit, logs)
        print(f"{name:9s} {r['wall_s']:8.1f} s wall {r['cpu_s']:8.1f} s CPU {r[f'{unit}_per_s']:9.1f} {unit}/s  "
              f"driver {r['driver_peak_rss_gib']:.2f} GiB, tree {r['peak_rss_gib']:.2f} GiB, "
              f"written {r['bytes_written'] / 2**20:.1f} MiB"
              + "".join(f"; {p} x{v['actors']} {v['peak_rss_gib_per_actor']:.2f} GiB/actor busy {v['busy']:.2f}"
                        for p, v in r["pools"].items()), flush=True)
    rows, unique = count_rows(run_dir)
    feats = phases["features"]
    fsum = json.loads((run_dir / "features" / "summary.json").read_text())
    driver_cpu, driver_main = fsum.get("driver_cpu_s"), fsum.get("driver_main_thread_cpu_s")
    return {
        "images": n, "corpus": corpus_n, "workers": workers, "batch_size": batch_size, "pools": pools, "nodes": 1,
        "sets": list(extra),
        "world_s": world_s,
        "phases": phases, "driver_peak_rss_gib": max(p["driver_peak_rss_gib"] for p in phases.values()),
        "index_resident_gib_per_node": feats["index_resident_gib_per_node"],
        "index_bytes_on_disk": du(index_root), "rows": rows, "rows_unique": unique,
        "framework_ms_per_image": 1000 * feats["framework_cpu_s"] / images,
        "driver_ms_per_image": None if driver_cpu is None else 1000 * driver_cpu / images,
        "driver_main_thread_ms_per_image": None if driver_main is None else 1000 * driver_main / images,
        # all its threads per second of extraction (issue 45: at most 30 ms/s; the main thread at most 0.5 ms/image)
        "driver_ms_per_s": None if driver_cpu is None or not fsum.get("seconds") else 1000 * driver_cpu / fsum["seconds"],
        # the same CPU by thread (Ray Data's executor, Ray's C++ threads, the main thread), in ms per image
        "driver_ms_per_image_by_thread": {k: 1000 * v / images for k, v in fsum.get("driver_cpu_s_by_thread", {}).items()},
        "extraction_s": fsum.get("seconds"),
        "report_html_bytes": du(run_dir / "report.html") if not features_only else None,
    }


def exponent(xs: list[float], ys: list[float]) -> float | None:
    """Least-squares slope of log y on log x (how y grows with x)."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y and y > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    den = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / den if den else None


def fit_sweep(results: list[dict]) -> dict:
    """Exponents: each phase's wall and peak memory against N (at each M), the encode against M."""
    out: dict = {"vs_images": {}, "encode_vs_corpus": {}}
    for m in sorted({r["corpus"] for r in results}):
        rs = sorted((r for r in results if r["corpus"] == m), key=lambda r: r["images"])
        for phase in rs[0]["phases"]:
            if phase == "encode":
                continue
            xs = [r["images"] for r in rs]
            out["vs_images"].setdefault(str(m), {})[phase] = {
                "wall_s": exponent(xs, [r["phases"][phase]["wall_s"] for r in rs]),
                "peak_rss_gib": exponent(xs, [r["phases"][phase]["peak_rss_gib"] for r in rs]),
                "driver_peak_rss_gib": exponent(xs, [r["phases"][phase]["driver_peak_rss_gib"] for r in rs])}
    for n in sorted({r["images"] for r in results}):
        rs = sorted((r for r in results if r["images"] == n), key=lambda r: r["corpus"])
        xs = [r["corpus"] for r in rs]
        out["encode_vs_corpus"][str(n)] = {"wall_s": exponent(xs, [r["phases"]["encode"]["wall_s"] for r in rs])}
    return out


def plot(results: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot")
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for m in sorted({r["corpus"] for r in results}):
        rs = sorted((r for r in results if r["corpus"] == m), key=lambda r: r["images"])
        for phase in ("features", "fit", "evaluate", "report"):
            ax.loglog([r["images"] for r in rs], [r["phases"][phase]["wall_s"] for r in rs], marker="o",
                      label=f"{phase}, M={m:,}")
    ax.set_xlabel("images per split (N)")
    ax.set_ylabel("wall seconds")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


def machine() -> dict:
    import ray
    import torch

    mem_total = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_total = int(line.split()[1]) * 1024
    cpu = platform.processor()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"cpu": cpu, "cpus": os.cpu_count(), "memory_gib": mem_total / GIB, "python": platform.python_version(),
            "torch": torch.__version__, "ray": ray.__version__, "gpu": torch.cuda.is_available()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=5000, help="images per split (test and val)")
    ap.add_argument("--corpus", type=int, default=COCO_CORPUS, help="corpus captions (rounded up to a multiple of 5)")
    ap.add_argument("--workers", type=int, default=1, help="actors per pool")
    ap.add_argument("--work", type=Path, default=None, help="inputs, runs and logs (default $ADJCAP_CACHE/scale)")
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    ap.add_argument("--sweep", action="store_true", help=f"N in {SWEEP_N} x M in {SWEEP_M}, with exponents")
    ap.add_argument("--keep", action="store_true", help="reuse a finished index and features (default: fresh)")
    ap.add_argument("--warm", action="store_true", help="a warm cache: the index and the remembered pixel geometries "
                    "kept, the run's features extracted anew (default: an empty cache)")
    ap.add_argument("--pools", choices=("auto", "split", "fused"), default="auto",
                    help="ray.pools (auto: fused on this CPU-only machine)")
    ap.add_argument("--features-only", action="store_true", help="only encode-corpus and the features phase")
    ap.add_argument("--batch-size", type=int, default=BATCH, help="ray.batch_size (images per Ray Data batch; "
                    "default: the headline's)")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="another setting for every phase (e.g. ray.data_poll_s=2), repeatable")
    args = ap.parse_args()
    work = args.work or Path(os.environ.get("ADJCAP_CACHE", "~/.cache/adjcap")).expanduser() / "scale"
    shapes = [(n, m) for m in SWEEP_M for n in SWEEP_N] if args.sweep else [(args.images, args.corpus)]
    results = []
    for n, m in shapes:
        print(f"== {n:,} + {n:,} images, {m:,} captions, --workers {args.workers}", flush=True)
        results.append(one(work, n, m, args.workers, fresh=not args.keep, batch_size=args.batch_size,
                           pools=args.pools, features_only=args.features_only, extra=tuple(args.sets),
                           warm=args.warm))
        r = results[-1]
        print(f"rows {r['rows']} unique {r['rows_unique']}; driver peak {r['driver_peak_rss_gib']:.2f} GiB; "
              f"index resident per node {r['index_resident_gib_per_node'] or float('nan'):.2f} GiB; framework "
              f"{r['framework_ms_per_image']:.1f} ms CPU/image; driver "
              f"{r['driver_ms_per_image'] if r['driver_ms_per_image'] is not None else float('nan'):.2f} ms CPU/image "
              f"(main thread {r['driver_main_thread_ms_per_image'] or float('nan'):.2f} ms/image; all threads "
              f"{r['driver_ms_per_s'] or float('nan'):.1f} ms/s of extraction)", flush=True)
    out = results[0] if not args.sweep else {"runs": results, "exponents": fit_sweep(results)}
    out["machine"] = machine()
    out["command"] = " ".join(["python", "benchmarks/scale.py", *sys.argv[1:]])
    if args.sweep:
        print(json.dumps(out["exponents"], indent=1))
        if args.json:
            plot(results, args.json.with_suffix(".png"))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=float))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

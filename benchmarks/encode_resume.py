"""A killed ``adjcap encode-corpus`` at the real corpus size resumes and gives the same index.

    python benchmarks/encode_resume.py                      # 566,747 captions, 1280 wide (bigG's), fp16
    python benchmarks/encode_resume.py --corpus 100000 --kill-at 0.3

With the scale benchmark's inputs (benchmarks/scale.py: the demo's retrieval CLIP widened to 1280, a corpus
of demo captions), it runs ``encode-corpus`` through the real command line, kills it (SIGKILL, the whole
process group: driver, Ray and its workers) once the given fraction of shards is on disk, runs the same
command again to completion, then encodes the same corpus afresh in another cache, uninterrupted. It
prints and (``--json``) writes: shards kept from the killed run, the wall time of each run, and whether the
two indexes are the same bytes (every shard's vectors and ids, by the manifest's sha256 and read back).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.scale import COCO_CORPUS, build_inputs, overrides  # noqa: E402


def index_dirs(cache: Path) -> list[Path]:
    return sorted(p for p in (cache / "index").glob("*") if p.is_dir())


def shards_on_disk(cache: Path) -> int:
    return sum(len(list(d.glob("shard-*.json"))) for d in index_dirs(cache))  # written after its arrays


def digest(index_dir: Path) -> str:
    """sha256 over every shard's vector and id files, in shard order (the files themselves)."""
    h = hashlib.sha256()
    for f in sorted([*index_dir.glob("shard-*.npy"), *index_dir.glob("ids-*.npy")]):
        h.update(f.name.encode())
        h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()[:16]


def encode(cache: Path, world: Path, env: dict, kill_at_shards: int | None = None) -> dict:
    cmd = [sys.executable, str(ROOT / "cli.py"), "encode-corpus", "--preset", "demo", "--benchmark", "scale",
           *overrides(cache, world, 1)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    killed = False
    while proc.poll() is None:
        if kill_at_shards is not None and shards_on_disk(cache) >= kill_at_shards:
            os.killpg(proc.pid, signal.SIGKILL)
            killed = True
            break
        time.sleep(0.2)
    out = proc.communicate()[0].decode(errors="replace")
    wall = time.perf_counter() - t0
    if not killed and proc.returncode != 0:
        raise RuntimeError(f"encode-corpus failed ({proc.returncode}):\n" + "\n".join(out.splitlines()[-15:]))
    return {"wall_s": round(wall, 1), "killed": killed, "shards_on_disk": shards_on_disk(cache), "log_tail": out[-3000:]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=int, default=COCO_CORPUS)
    ap.add_argument("--kill-at", type=float, default=0.5, help="fraction of shards on disk when the run is killed")
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("ADJCAP_CACHE", "~/.cache/adjcap")).expanduser()
                    / "encode-resume")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    cache, world = build_inputs(args.work, 1, args.corpus)
    fresh_cache = args.work / "fresh-cache"  # the same models and corpus, another index directory
    fresh_cache.mkdir(parents=True, exist_ok=True)
    for sub in ("tiny", "demo", "retrieval-clip-1280"):
        if not (fresh_cache / sub).exists():
            (fresh_cache / sub).symlink_to((cache / sub).resolve(), target_is_directory=True)
    for c in (cache, fresh_cache):
        subprocess.run(["rm", "-rf", str(c / "index")], check=True)
    shard_size = 16384
    n_shards = -(-args.corpus // shard_size)
    kill_at = max(1, int(n_shards * args.kill_at))
    killed = encode(cache, world, env, kill_at_shards=kill_at)
    resumed = encode(cache, world, env)
    fresh = encode(fresh_cache, world, env)
    (a,), (b,) = index_dirs(cache), index_dirs(fresh_cache)
    res = {"corpus": args.corpus, "shards": n_shards, "killed_after_shards": killed["shards_on_disk"],
           "killed_wall_s": killed["wall_s"], "resumed_wall_s": resumed["wall_s"], "fresh_wall_s": fresh["wall_s"],
           "digest_resumed": digest(a), "digest_fresh": digest(b), "same_name": a.name == b.name,
           "resume_log": resumed["log_tail"]}
    res["same"] = res["digest_resumed"] == res["digest_fresh"]
    print(json.dumps({k: v for k, v in res.items() if k != "resume_log"}, indent=2))
    print(resumed["log_tail"])
    if args.json:
        args.json.write_text(json.dumps(res, indent=2))
    return 0 if res["same"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""The rooms a job's pool planning walks through (issue 45, "the walk of the configuration from the job's
entry"): the calls `adjcap run-job` makes to plan its pools, from the preflight through the run plan to
the feature job's checks and layout (adjcap/engine/pools.py, adjcap/engine/cluster_plan.py, jobs/ray_session.py,
jobs/preflight.py, jobs/extract_features.py), with Ray's answers given (a 16-CPU node, no GPU; the demo
preset split). A room entry is a call into a function of another room than the last call's; a return
to a room counts again.

    python benchmarks/config_walk.py [--out benchmarks/results/config-walk.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from collections import Counter
from pathlib import Path

ROOMS = ("adjcap/engine/pools.py", "adjcap/engine/cluster_plan.py", "jobs/ray_session.py", "adjcap/engine/run_plan.py",
         "jobs/preflight.py", "jobs/extract_features.py")
GiB = 2**30


def walk() -> list[str]:
    """The rooms, in the order the job's pool planning enters them."""
    import ray

    from adjcap.engine.cluster_plan import NodeType, PoolPlan
    from adjcap.config import load_config
    from adjcap.jobs import extract_features, preflight, ray_session

    cfg = load_config("demo", ["ray.pools=split"]).resolved()
    ray_session.cluster_facts = lambda cfg: ((NodeType("local", 16, 0, 64 * GiB, 1, up=1),), False)
    preflight.local_cluster = lambda: {"CPU": 16.0, "GPU": 0.0, "memory": 64 * GiB}
    ray.cluster_resources = lambda: {"CPU": 16.0, "memory": 64 * GiB}
    trail: list[str] = []

    def entered(frame, event, arg):
        if event == "call":
            room = next((r for r in ROOMS if frame.f_code.co_filename.endswith(r)), None)
            if room and (not trail or trail[-1] != room):
                trail.append(room)

    sys.setprofile(entered)
    try:
        preflight.memory_problem(cfg)  # jobs/run.py:plan_run, before Ray
        plan = PoolPlan.of(cfg)  # RunPlan.build's pools
        ray_session.check_pools(plan)  # extract_features: refused up front
        extract_features.pools(plan, 0, False)  # the "pools:" line
        extract_features.stream_stages(plan, 0, False)  # the progress board
        extract_features.pools(plan, 0, False)  # the stream
        plan.decode_batch(False)
        ray_session.check_pools(plan, 0)
    finally:
        sys.setprofile(None)
    return trail


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    trail = walk()
    out = {"command": "python benchmarks/config_walk.py", "device": f"{platform.machine()} CPU (no Ray started)",
           "room_entries": len(trail), "rooms": len(set(trail)), "entries_by_room": dict(Counter(trail)),
           "walk": [r.rsplit("/", 1)[-1].removesuffix(".py") for r in trail]}
    print(json.dumps(out, indent=1))
    if args.out:
        args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()

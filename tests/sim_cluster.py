"""A Ray cluster simulated on this machine for the multi-node tests: a head (1 CPU, no GPU) and worker
nodes with 8 logical CPUs and ``gpus`` logical GPUs each (ray.cluster_utils.Cluster), every server on
127.0.0.1. The GPUs are Ray resources only: actors are scheduled as on GPU machines and run on the CPU."""

import contextlib
import os
from collections.abc import Collection, Iterator


@contextlib.contextmanager
def simulated_cluster(gpu_nodes: int = 2, gpus: int = 2) -> Iterator[tuple[object, list[object]]]:
    """(cluster, [worker node, ...]); the cluster is shut down and Ray's settings restored on exit."""
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    old = ray_constants.ENABLE_RAY_CLUSTER, os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")
    ray_constants.ENABLE_RAY_CLUSTER = False  # this driver's node IP: 127.0.0.1
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # Ray's own processes (they inherit it)
    local = {"node_ip_address": "127.0.0.1", "object_store_memory": 150 << 20}
    c = Cluster(initialize_head=True, head_node_args={**local, "num_cpus": 1, "num_gpus": 0,
                                                      "include_dashboard": False})
    nodes = [c.add_node(**local, num_cpus=8, num_gpus=gpus) for _ in range(gpu_nodes)]
    c.wait_for_nodes()
    try:
        yield c, nodes
    finally:
        c.shutdown()
        ray_constants.ENABLE_RAY_CLUSTER = old[0]
        if old[1] is None:
            os.environ.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
        else:
            os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = old[1]


def raylet_pid(node) -> int:
    """The process id of ``node``'s raylet (a ray.cluster_utils node)."""
    from ray._private import ray_constants

    return node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid


def node_workers(raylets: Collection[int]) -> Iterator[tuple[int, int, str]]:
    """(pid, its raylet's pid, process title) of each worker process of the nodes whose raylets are
    ``raylets``: every node of the simulated cluster is a raylet on this machine and a node's workers are
    its raylet's children; a worker's title, ``ray::MapWorker(MapBatches(RetrieverActor))`` or
    ``ray::MapBatches(decode_batch)`` while it runs a task, names its work."""
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid not in raylets:
                continue
            with open(f"/proc/{d}/cmdline", "rb") as f:
                title = f.read().decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        yield int(d), ppid, title

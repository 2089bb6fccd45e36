"""An autoscaling Ray cluster on this machine for the autoscaling rehearsal: a head (1 CPU, no GPU)
started here (ray.cluster_utils.Cluster, every server on 127.0.0.1) and Ray's own autoscaler (the v1
monitor) over Ray's fake multi-node provider, which adds worker nodes with logical GPUs as real raylets
when a job asks for them. The node types are a cluster launcher config (``available_node_types``), like
deploy/ray-cluster-aws-l4.yaml's.

Ray's ``AutoscalingCluster`` is not used: it runs `ray stop --force` (every Ray on the machine) and reads
a defaults file its wheel does not ship; the monitor runs here as a process of its own (``python
autoscaling_sim.py ...``), whose workers go with it (RAY_AUTOSCALER_FATESHARE_WORKERS)."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

HEAD_ID = "fffffffffffffffffffffffffffffffffffffffffffffffffff00000"  # the fake provider's head node id


def launcher_config(worker_types: dict, head_cpus: int = 1, gcs: str = "") -> dict:
    """A cluster launcher config for the fake provider: ``worker_types`` as its available node types."""
    return {
        "cluster_name": "adjcap-rehearsal", "max_workers": sum(t.get("max_workers", 0) for t in worker_types.values()),
        "upscaling_speed": 10.0, "idle_timeout_minutes": 5, "docker": {},
        "provider": {"type": "fake_multinode", "gcs_address": gcs, "use_node_id_as_ip": True,
                     "disable_node_updaters": True, "disable_launch_config_check": True},
        "auth": {"ssh_user": "ubuntu"},
        "available_node_types": {"ray.head.default": {"resources": {"CPU": head_cpus}, "node_config": {}, "max_workers": 0},
                                 **worker_types},
        "head_node_type": "ray.head.default",
        "file_mounts": {}, "cluster_synced_files": [], "file_mounts_sync_continuously": False,
        "rsync_exclude": [], "rsync_filter": [], "initialization_commands": [], "setup_commands": [],
        "head_setup_commands": [], "worker_setup_commands": [], "head_start_ray_commands": [],
        "worker_start_ray_commands": [],
    }


@contextlib.contextmanager
def autoscaling_cluster(worker_types: dict, tmp: Path) -> Iterator[tuple[object, Path]]:
    """(the head's cluster, the launcher config file the autoscaler reads); shut down on exit."""
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    old = ray_constants.ENABLE_RAY_CLUSTER, dict(os.environ)
    ray_constants.ENABLE_RAY_CLUSTER = False  # this driver's node IP: 127.0.0.1
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # Ray's own processes (they inherit it)
    os.environ["RAY_OVERRIDE_NODE_ID_FOR_TESTING"] = HEAD_ID  # the head the fake provider knows
    c = Cluster(initialize_head=True, head_node_args={"node_ip_address": "127.0.0.1", "num_cpus": 1, "num_gpus": 0,
                                                      "object_store_memory": 150 << 20, "include_dashboard": False})
    os.environ.pop("RAY_OVERRIDE_NODE_ID_FOR_TESTING")
    conf = tmp / "cluster.yaml"
    conf.write_text(json.dumps(launcher_config(worker_types, gcs=c.address)))
    env = {**os.environ, "RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1",
           "RAY_AUTOSCALER_FATESHARE_WORKERS": "1"}
    log = open(tmp / "monitor.log", "w")
    monitor = subprocess.Popen([sys.executable, __file__, c.address, str(conf)], env=env, stdout=log,
                               stderr=subprocess.STDOUT)
    try:
        yield c, conf
    finally:
        monitor.send_signal(signal.SIGTERM)  # its workers are terminated with it (kill_workers)
        try:
            monitor.wait(60)
        except subprocess.TimeoutExpired:
            monitor.kill()
            monitor.wait()
        log.close()
        c.shutdown()
        ray_constants.ENABLE_RAY_CLUSTER = old[0]
        os.environ.clear()
        os.environ.update(old[1])


def gpu_nodes_up() -> int:
    import ray

    return sum(1 for n in ray.nodes() if n.get("Alive") and n["Resources"].get("GPU", 0) > 0)


def wait_until(test, timeout: float = 120.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if test():
            return True
        time.sleep(0.5)
    return False


if __name__ == "__main__":  # the autoscaler: python autoscaling_sim.py GCS_ADDRESS CONFIG
    import ray.autoscaler._private.providers as providers
    from ray.autoscaler._private.monitor import Monitor

    # the fake provider's defaults (its example.yaml, not in the wheel): the config itself
    providers._DEFAULT_CONFIGS["fake_multinode"] = lambda: sys.argv[2]
    import logging

    logging.basicConfig(level=logging.INFO)  # its log: monitor.log beside the config
    Monitor(sys.argv[1], sys.argv[2]).run()  # no monitor_ip: no metrics server on a fixed port

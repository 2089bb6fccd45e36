"""Connecting to Ray: an embedded local Ray (started and stopped here, dashboard on 127.0.0.1) or an
existing cluster (``--address``, or the one ``ray job submit`` runs us in)."""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Iterator

import ray

from adjcap.config import Config

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def ray_session(cfg: Config) -> Iterator[None]:
    if ray.is_initialized():  # e.g. inside `ray job submit` or a notebook that already connected
        yield
        return
    address = cfg.ray.address or os.environ.get("RAY_ADDRESS")
    runtime_env = {"env_vars": {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                                "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "0"),
                                "TOKENIZERS_PARALLELISM": "false"}}
    if address:
        ray.init(address=address, runtime_env=runtime_env, logging_level=logging.WARNING)
    else:
        include = cfg.ray.include_dashboard
        ctx = ray.init(
            include_dashboard=include,
            dashboard_host=cfg.ray.dashboard_host,
            runtime_env=runtime_env,
            logging_level=logging.WARNING,
            configure_logging=True,
        )
        url = getattr(ctx, "dashboard_url", None)
        if url:
            print(f"Ray dashboard: http://{url}")
    try:
        yield
    finally:
        ray.shutdown()


def has_gpus() -> bool:
    return float(ray.cluster_resources().get("GPU", 0)) > 0


def pool_resources(cfg: Config, pool: str) -> dict[str, float]:
    """Fractional GPU per actor so one GPU hosts one actor of every pool; on CPU-only clusters a
    fraction of a CPU so all pools fit on a 2-core machine."""
    if has_gpus():
        return {"num_gpus": float(cfg.ray.gpu_share.get(pool, 0.25)), "num_cpus": 1.0}
    return {"num_cpus": cpu_share(cfg)}


POOLS = 4


def cpu_share(cfg: Config) -> float:
    """CPUs per actor without GPUs: the configured share, shrunk so that every actor of the four
    pools plus the decode tasks fit in the cluster's CPUs (else Ray Data waits forever)."""
    total = float(ray.cluster_resources().get("CPU", 1.0))
    # Ray Data stalls when its operators' requests add up to every CPU: keep 20% headroom
    room = max(0.8 * total - cfg.ray.decode_cpus, 0.1)
    pools = POOLS + (cfg.verifier.enabled and cfg.verifier.backend == "lavis")  # + the LAVIS scorer pool
    return round(min(float(cfg.ray.cpu_share), room / (pools * cfg.ray.workers)), 4)

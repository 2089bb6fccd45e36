"""Which backend runs a job's stages, by the config's ``executor`` (docs/architecture.md, "Data flow
of one image": one engine, two backends): ``ray`` (the default) connects to Ray for the job (:func:`adjcap.jobs.ray_session.ray_session`)
and streams the images through Ray Data pools (:class:`adjcap.jobs.ray_backend.RayExecutor`); ``local``
starts no Ray and runs the same decode and pool batch functions in the job's own process
(:class:`adjcap.engine.local.LocalExecutor`), the models loaded once per job by the same family loaders.
Both write the same run directory, parts and stage cache."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from adjcap.config import Config
from adjcap.engine.executor import Executor
from adjcap.engine.run_plan import RunPlan
from adjcap.machine import numerics


def on_ray(cfg: Config) -> bool:
    return cfg.executor == "ray"


@contextlib.contextmanager
def job_session(cfg: Config) -> Iterator[None]:
    """Around a job's stages (``cfg`` resolved): its Ray session, or, in process, only the numerics pin."""
    if on_ray(cfg):
        from adjcap.jobs.ray_session import ray_session

        with ray_session(cfg):
            yield
        return
    numerics.enter(cfg.numerics, restart=False)  # the command line already restarted itself with the pin
    yield


def gpu_present(cfg: Config) -> bool:
    """The job's stages have a GPU: on the connected Ray cluster, or, in process, ``device`` resolved to CUDA."""
    if on_ray(cfg):
        from adjcap.jobs.ray_session import has_gpus

        return has_gpus()
    return str(cfg.device).startswith("cuda")


def check_pools(plan: RunPlan) -> None:
    """On Ray: refuse an impossible --workers / memory request before any model loads (and ask an
    autoscaler for the nodes); in process there is nothing to place."""
    if on_ray(plan.cfg):
        from adjcap.jobs.ray_session import check_pools as on_cluster

        on_cluster(plan.pools)


def executor_for(plan: RunPlan, board: Any) -> Executor:
    """The backend that runs the plan's stream (``board``: the job's progress board)."""
    if on_ray(plan.cfg):
        from adjcap.jobs.ray_backend import RayExecutor

        return RayExecutor(plan.pools, plan.corpus, board)
    from adjcap.engine.local import LocalExecutor
    from adjcap.engine.pipeline import load_models

    return LocalExecutor(vars(load_models(plan.cfg, corpus=plan.corpus)), board)  # the plan's corpus, read once


def executor_problem(cfg: Config) -> str | None:
    """Why ``executor = local`` cannot run ``cfg`` (resolved), or None: a backend that its verifier family's
    record declares isolated (the ``lavis`` backend's environment of its own) runs only on Ray."""
    if on_ray(cfg):
        return None
    from adjcap.engine import verifier_families

    if verifier_families.isolated(cfg.verifier) is None:
        return None
    return (f"executor=local runs every stage in this process, but verifier.backend={cfg.verifier.backend} runs "
            "in an environment of its own: set executor=ray")

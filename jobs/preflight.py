"""Before a job starts Ray or writes anything: are the config's weights, data and NLTK data here
(:mod:`adjcap.machine.needs`), Java too when the job evaluates, and does one actor of every pool fit in the memory a local Ray would have
(the run plan's pools, :class:`adjcap.engine.cluster_plan.PoolPlan`)? A refusal is one line naming each missing thing,
the one ``adjcap prepare`` command that fetches it, and the memory shortfall; a candidates file
(:mod:`adjcap.data.candidates`) and COCO instances files (:mod:`adjcap.metrics.chair`) are checked whole,
their file and line named."""

from __future__ import annotations

import os

from adjcap.machine.accelerators import visible_gpus
from adjcap.config import Config
from adjcap.machine.needs import Need, missing, needs_of, steps_for
from adjcap.prepare.steps import STEPS
from adjcap.engine.cluster_plan import PoolPlan, ResourceError
from adjcap.jobs.executors import executor_problem, on_ray
from adjcap.models.lavis_env import LavisEnvError

# what a job cannot start without; one that evaluates also needs Java (the PTB tokenizer and METEOR of
# every evaluation, SPICE's jars where it scores SPICE), checked here rather than after the features
PREFLIGHT_GROUPS = ("weights", "data", "nltk")
EVALUATION_GROUPS = ("java",)


class PreflightError(RuntimeError):
    """The job would fail after starting: the message says what is missing and how to get it."""


def local_cluster() -> dict[str, float]:
    """The resources a new local Ray would register on this machine: its CPUs, GPUs, and the memory
    it leaves for tasks and actors (available memory less the object store, as Ray computes it), and the
smallest visible GPU's memory (``gpu_memory``)."""
    try:
        from ray._private.utils import estimate_available_memory, resolve_object_store_memory

        avail = float(estimate_available_memory())
        memory = avail - float(resolve_object_store_memory(int(avail)))
    except Exception:  # noqa: BLE001 - another Ray version: Ray's default share (70%) of what is free
        import psutil

        memory = 0.7 * psutil.virtual_memory().available
    gpus = visible_gpus()
    out = {"CPU": float(os.cpu_count() or 1), "GPU": float(len(gpus)), "memory": memory}
    if gpus:  # not a Ray resource: the pool plan checks the models' GPU memory against the smallest GPU
        out["gpu_memory"] = float(min(g.total_bytes for g in gpus))
    return out


def in_process(cfg: Config) -> Config:
    """``cfg`` as far as memory goes for an ``executor = local`` job: its process loads each model once (the
    fused pool's models), however many actors ``ray.workers`` / ``ray.pool.<pool>.actors`` ask of Ray."""
    return cfg.model_copy(update={"ray": cfg.ray.model_copy(update={"workers": 1, "pools": "fused", "pool": {}})})


def memory_problem(cfg: Config) -> str | None:
    """Why the pools cannot be placed (``cfg`` resolved), or None: on a connected cluster against its node
    types node by node (:func:`adjcap.engine.cluster_plan.plan_cluster`), else against the local Ray this machine
    would start (or, with ``executor = local``, this machine). On an existing cluster not yet connected
    (``--address``) the job checks after connecting."""
    import ray

    try:
        ray_job = on_ray(cfg)  # executor=local: the stages run on this machine, whatever Ray is up
        if ray_job and ray.is_initialized():  # a connected cluster: its node types, node by node (adjcap.engine.cluster_plan)
            from adjcap.jobs.ray_session import cluster_facts

            PoolPlan.of(cfg).on_cluster(cluster_facts(cfg)[0])
        elif ray_job and (cfg.ray.address or os.environ.get("RAY_ADDRESS")):
            return None
        elif ray_job:
            PoolPlan.of(cfg).on_node(local_cluster())
        else:  # in process: every model once, as one fused actor would hold them, whatever --workers says
            try:
                PoolPlan.of(in_process(cfg)).on_node(local_cluster())
            except ResourceError as e:
                return f"executor=local holds every model once in this process, and it does not fit: {e}"
    except (ResourceError, LavisEnvError) as e:
        return str(e)
    return None


def prepare_command(cfg: Config, gone: list[Need]) -> str:
    """The one ``adjcap prepare`` command that fetches exactly the missing things: their steps, with
    ``--preset`` for the models step (it fetches that preset's weights), ``--from DIR`` for Flickr30k."""
    steps = [s for s in STEPS if s in steps_for(gone)]
    cmd = f"adjcap prepare {' '.join(steps)}"
    if "models" in steps:
        cmd += f" --preset {cfg.name}"
    if "flickr30k" in steps:
        cmd += " --from DIR"
    return cmd


def candidates_problem(cfg: Config) -> str | None:
    """With ``captioner.family = candidates``: why its file cannot be used, or None: every check of
    :mod:`adjcap.data.candidates` (the file's line named), against every image the benchmark has, and
    every image the job will caption (``limit`` applied) present unless ``captioner.candidates.allow_missing``.
    The LM judge and its tokenizer are weights: :func:`problems` names them when missing."""
    if cfg.captioner.family != "candidates":
        return None
    from adjcap.engine.captioners import candidates_table
    from adjcap.data.candidates import CandidatesError, match_records
    from adjcap.engine.run_plan import read_records

    try:
        table = candidates_table(cfg.captioner)
        every = read_records(cfg.model_copy(update={"limit": None}))  # every image the benchmark has
        captioned = read_records(cfg) if cfg.limit is not None else every
        match_records(table, [r for rs in every.values() for r in rs], cfg.benchmark_cfg().images,
                      captioned=[r.image_id for rs in captioned.values() for r in rs],
                      allow_missing=cfg.captioner.candidates.allow_missing)
    except CandidatesError as e:
        return str(e)
    return None


def instances_problem(cfg: Config) -> str | None:
    """With ``eval.chair = instances | both`` on COCO: why its instances files cannot be used (missing,
    not COCO instances, an unknown category id, a class outside CHAIR's synonym lists: the file named),
    or None; checked here so a job does not learn it after its Ray stages (:mod:`adjcap.metrics.chair`)."""
    if cfg.eval.chair == "proxy" or cfg.benchmark != "coco":
        return None
    from adjcap.metrics.chair import load_instance_objects

    try:
        load_instance_objects(list(cfg.eval.coco_instances))
    except (ValueError, OSError) as e:
        return str(e)
    return None


def vlm_problem(cfg: Config) -> str | None:
    """With ``captioner.family = vlm``: why its checkpoint or prompt cannot run (not an image-text-to-text
    model; a prompt without the processor's image placeholder), or None."""
    if cfg.captioner.family != "vlm":
        return None
    from adjcap.models.vlm_captioner import settings_problem

    return settings_problem(cfg.captioner.vlm)


def problems(cfg: Config, evaluates: bool = True) -> str | None:
    """One line saying why ``cfg`` (resolved) cannot run here, or None. ``evaluates``: the job scores
    its captions (Java is then needed too)."""
    gone = missing(needs_of(cfg, PREFLIGHT_GROUPS + (EVALUATION_GROUPS if evaluates else ())))
    parts = []
    parts += [p for p in (candidates_problem(cfg), instances_problem(cfg), vlm_problem(cfg), executor_problem(cfg)) if p]
    if gone:
        fetchable = [n for n in gone if n.step]
        other = [n for n in gone if not n.step]
        if fetchable:
            parts.append(f"missing {', '.join(n.what for n in fetchable)} (fetch with "
                         f"`{prepare_command(cfg, fetchable)}`)")
        parts += [f"missing {n.what} ({n.hint})" for n in other]
    mem = memory_problem(cfg)
    if mem:
        parts.append(f"resource plan: {mem}")
    if not parts:
        return None
    return f"preset '{cfg.name}' cannot run here: " + "; ".join(parts) + " (adjcap doctor --preset " + cfg.name + ")"


def check(cfg: Config, evaluates: bool = True) -> None:
    """Raise PreflightError (one line) unless ``cfg`` (resolved) can run here."""
    why = problems(cfg, evaluates)
    if why:
        raise PreflightError(why)

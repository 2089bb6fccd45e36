"""Connecting to Ray: an embedded local Ray (started and stopped here) or an existing cluster
(``--address``, or the one ``ray job submit`` runs us in).

The embedded local Ray listens on 127.0.0.1 only (GCS, raylet, object manager, workers, agents and,
unless ``ray.dashboard_host`` says otherwise, the dashboard), and its auth token file is made
readable by its owner only (``~/.ray`` 0700, the token 0600)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from pathlib import Path
from typing import Iterator

import ray

from adjcap import numerics
from adjcap.accelerators import rocm_visible_env
from adjcap.config import Config
from adjcap import pools as pool_layout
from adjcap.models.budget import human_bytes
from adjcap.pools import pool_budget
from adjcap.jobs.ray_guards import ClusterWatch, reap_with_driver

# the directory the workers import this code from: the one holding the ``adjcap`` package (a checkout
# or site-packages). Taken from adjcap/numerics.py, a real file in adjcap/, so resolving it
# is safe; this file's path is not (in a checkout adjcap/jobs links to the repository's jobs/, whose
# grandparent is the checkout's parent: docs/architecture.md, "One layout").
ROOT = Path(numerics.__file__).resolve().parents[1]
LOOPBACK = "127.0.0.1"
# Ray picks a loopback node IP (instead of the machine's address) when this is off; it is read
# from the environment at `import ray`, so the module constant is set as well while a local Ray starts.
_LOCAL_ONLY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


@contextlib.contextmanager
def _loopback_only() -> Iterator[None]:
    """While the embedded Ray runs: its node IP is 127.0.0.1, so every server it starts binds there."""
    from ray._private import ray_constants

    old_env = os.environ.get(_LOCAL_ONLY_ENV)
    old_const = getattr(ray_constants, "ENABLE_RAY_CLUSTER", True)
    os.environ[_LOCAL_ONLY_ENV] = "0"  # for Ray's own processes (they inherit it)
    ray_constants.ENABLE_RAY_CLUSTER = False  # for this driver, which imported ray already
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = old_const
        if old_env is None:
            os.environ.pop(_LOCAL_ONLY_ENV, None)
        else:
            os.environ[_LOCAL_ONLY_ENV] = old_env


def auth_token_path() -> Path:
    """Where Ray keeps the token of token authentication: $RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token."""
    custom = os.environ.get("RAY_AUTH_TOKEN_PATH")
    return Path(custom).expanduser() if custom else Path.home() / ".ray" / "auth_token"


def _private_token_dir() -> None:
    """~/.ray as 0700 before Ray writes its token there (Ray writes it 0644)."""
    if os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return
    d = auth_token_path().parent
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = d.lstat()
    if st.st_uid == os.geteuid() and not d.is_symlink():
        d.chmod(0o700)


def _private_token_file() -> None:
    """The token file 0600 (Ray creates it with the process umask, usually 0644)."""
    p = auth_token_path()
    try:
        st = p.lstat()
    except FileNotFoundError:
        return
    if st.st_uid == os.geteuid() and not p.is_symlink() and st.st_mode & 0o077:
        p.chmod(0o600)


# Ray's loggers that speak at INFO on the console ("ray.data" keeps its full log in the session's ray-data.log)
QUIET_LOGGERS = ("ray", "ray.data")
# "Token authentication is enabled ..." on every start of the embedded Ray: it is adjcap that enabled it
AUTH_NOTICE_LOGGER = "ray._private.authentication.authentication_token_setup"
# "Progress bars disabled. To enable, set ..." at every dataset: it is adjcap that disabled them
PROGRESS_NOTICE_LOGGER = "ray.data._internal.progress"


def quiet_console(verbose: bool) -> None:
    """Ray's share of the console: with ``verbose`` as Ray has it (Ray Data's operator progress,
    INFO lines); else off: Ray Data prints no progress bars, execution plans or issue-detector
    reports, and Ray's loggers say only warnings and errors. adjcap's own progress
    (:mod:`adjcap.jobs.progress_display`) is shown either way."""
    from ray.data import DataContext

    ctx = DataContext.get_current()
    ctx.enable_progress_bars = verbose
    ctx.enable_operator_progress_bars = verbose
    ctx.print_on_execution_start = verbose
    level = logging.INFO if verbose else logging.WARNING
    logging.getLogger("ray").setLevel(level)
    for name in QUIET_LOGGERS:  # their console handlers only: Ray's log files stay complete
        for h in logging.getLogger(name).handlers:
            if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler):
                h.setLevel(level)
    for notice in (AUTH_NOTICE_LOGGER, PROGRESS_NOTICE_LOGGER):
        logging.getLogger(notice).setLevel(level if verbose else logging.ERROR)


def data_poll(seconds: float) -> None:
    """How long Ray Data's scheduler on the driver waits for its running tasks before it looks at them
    again (Ray's own: 0.1 s). Each look (resources, budgets, dispatch) costs the driver about the same
    CPU whatever the images, so a job's driver CPU grows with its wall time at a rate set here
    (docs/benchmarks/pipeline.md, "The driver off the image path"); a finished task's block waits for the next look, and
    the actor meanwhile works on the tasks queued on it. Ray keeps the value in a module constant; a Ray
    without it is left as it is."""
    from ray.data._internal.execution import streaming_executor_state as state

    if hasattr(state, "WAIT_FOR_TASK_COMPLETION_TIMEOUT_S"):
        state.WAIT_FOR_TASK_COMPLETION_TIMEOUT_S = float(seconds)


def init_options(cfg: Config) -> dict:
    """What ray.init is told about the console in either mode: the workers' output forwarded to the
    driver and Ray's own log level only with ``ray.verbose``."""
    verbose = cfg.ray.verbose
    return {"logging_level": logging.INFO if verbose else logging.WARNING, "log_to_driver": verbose}


@contextlib.contextmanager
def _keep_signal_handlers() -> Iterator[None]:
    """``ray.init`` installs its own SIGTERM (and SIGINT) handlers in the driver, so a scheduler's stop
    would end the job with a stack dump instead of the job's one-line stop (cli.py ``_run``): the
    handlers the job had before ``ray.init`` are put back after it (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, handler in before.items():
            if handler is not None and signal.getsignal(s) is not handler:
                signal.signal(s, handler)


def _init(**kwargs):
    with _keep_signal_handlers():
        return ray.init(**kwargs)


@contextlib.contextmanager
def ray_session(cfg: Config) -> Iterator[None]:
    quiet_console(cfg.ray.verbose)
    data_poll(cfg.ray.data_poll_s)
    numerics.enter(cfg.numerics, restart=False)  # the command line already restarted itself with the pin
    if ray.is_initialized():  # e.g. inside `ray job submit` or a notebook that already connected
        yield
        return
    address = cfg.ray.address or os.environ.get("RAY_ADDRESS")
    runtime_env = {"env_vars": {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                                "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "0"),
                                "TOKENIZERS_PARALLELISM": "false", **numerics.worker_env(cfg.numerics)}}
    if address:
        _init(address=address, runtime_env=runtime_env, **init_options(cfg))
        try:
            with ClusterWatch(address, ray.get_runtime_context().gcs_address):  # a lost cluster: one line
                yield
        finally:
            ray.shutdown()
        return
    os.environ.update(rocm_visible_env())  # AMD nodes that set ROCR_VISIBLE_DEVICES only (Ray refuses those)
    with _loopback_only():
        _private_token_dir()
        try:
            ctx = _init(
                address="local",  # a new embedded instance, never a cluster some `ray start` left on this machine
                include_dashboard=cfg.ray.include_dashboard,
                dashboard_host=cfg.ray.dashboard_host,
                _node_ip_address=LOOPBACK,
                runtime_env=runtime_env,
                configure_logging=True,
                **init_options(cfg),
                **({"_metrics_export_port": cfg.ray.metrics_export_port} if cfg.ray.metrics_export_port else {}),
            )
        finally:
            _private_token_file()
        quiet_console(cfg.ray.verbose)  # ray.init configured its loggers anew
        url = getattr(ctx, "dashboard_url", None)
        if url:
            print(f"Ray dashboard: http://{url}")
        # the embedded Ray never outlives this driver, however it ends (docs/architecture.md, "Pools")
        lifeline = reap_with_driver(ctx.address_info["session_dir"], ROOT)
        try:
            yield
        finally:
            ray.shutdown()
            lifeline.close()


def has_gpus() -> bool:
    return float(ray.cluster_resources().get("GPU", 0)) > 0


class ResourceError(RuntimeError):
    """A request the cluster can never grant (Ray would wait forever); the message has the numbers."""


# a Ray worker process with torch, transformers and open_clip imported, before any weights: its own
# pages (USS) as Ray Data measured them on the demo's actors (Ray 2.60, torch CPU): corpus encoder 597 MiB,
# retriever 572, verifier 563, captioner 600, scorer 601 (with tiny models of a few MiB), rounded up
ACTOR_BASE_BYTES = 608 * 2**20
# the fused actor imports every stage's libraries in one process: 630 MiB measured by Ray Data on the demo's
# fused actor (tiny models), rounded up
FUSED_BASE_BYTES = 672 * 2**20
# working memory on top of what is loaded (activations of a batch, tokenizers, the loading copy); it is
# also the headroom Ray Data's memory issue detector asks for (it warns when 1.25 x the peak USS exceeds
# the request), so a request that covers the real use raises no false alarm
WORKING_FACTOR = 1.25
# below this CPU share per actor the pools never get past model loading on a small machine
MIN_CPU_SHARE = 0.1


def actor_memory(model_bytes: int, pool: str = "") -> int:
    """Host memory one actor asks Ray for: the worker process (a fused actor's is larger) plus its models
    at run precision."""
    base = FUSED_BASE_BYTES if pool == pool_layout.FUSED else ACTOR_BASE_BYTES
    return int(WORKING_FACTOR * (base + model_bytes))


def _actors_phrase(pools: tuple[str, ...], count: dict[str, int]) -> str:
    """"4 pools x 2 actors" (every pool alike) or "retriever 1 + captioner 3 actors"."""
    if len(set(count.values())) <= 1:
        k = count[pools[0]] if pools else 0
        return f"{len(pools)} pool{'s' if len(pools) != 1 else ''} x {k} actors"
    return " + ".join(f"{p} {count[p]}" for p in pools) + " actors"


def _asked(cfg: Config, pools: tuple[str, ...], count: dict[str, int]) -> str:
    """Who asked: ``--workers N`` when every pool has ``ray.workers`` actors, else the pools' own counts."""
    return f"--workers {cfg.ray.workers}" if all(count[p] == cfg.ray.workers for p in pools) else "ray.pool.<pool>.actors"


def pool_plan(cfg: Config, cluster: dict[str, float], pools: tuple[str, ...] | None = None,
              working: dict[str, int] | None = None, first: int = 0) -> dict[str, dict[str, float]]:
    """The Ray resources of one actor of every pool in ``pools`` (default: the pools the job runs on
    this cluster from stage index ``first`` on, split or fused: :func:`adjcap.pools.layout`) on a
    cluster with ``cluster`` resources (``ray.cluster_resources()``), or a ResourceError when the
    pools' actors (:func:`adjcap.pools.actors`) can never be placed: too many CPUs, GPUs or bytes of
    memory asked for. A fused actor asks for the memory of every model it holds, each once. Pure."""
    gpu = float(cluster.get("GPU", 0)) > 0
    if pools is None:
        pools = tuple(p.name for p in pool_layout.layout(cfg, gpu, first))
    budget = pool_budget(cfg, gpu=gpu)
    cpus = float(cluster.get("CPU", 1.0))
    count = {p: pool_layout.actors(cfg, p) for p in pools}
    asked, phrase = _asked(cfg, pools, count), _actors_phrase(pools, count)
    n = sum(count.values())
    plan: dict[str, dict[str, float]] = {}
    if gpu:
        gpus = float(cluster["GPU"])
        shares = {p: pool_layout.gpu_share(cfg, p) for p in pools}
        need = sum(count[p] * shares[p] for p in pools)
        if need > gpus + 1e-9:
            if len(set(count.values())) == 1:
                how = f"{' + '.join(f'{shares[p]:g}' for p in pools)} GPU x {count[pools[0]]}"
                fewer = f"use --workers {max(1, int(gpus // max(sum(shares.values()), 1e-9)))}"
            else:
                how = " + ".join(f"{count[p]} x {shares[p]:g}" for p in pools) + " GPU"
                fewer = "use fewer ray.pool.<pool>.actors"
            raise ResourceError(f"{asked}: {phrase} need {how} = {need:g} GPUs, the cluster has {gpus:g}; "
                                f"{fewer} or lower ray.gpu_share / ray.pool.<pool>.gpus")
        each = {p: pool_layout.cpu_request(cfg, p) or 1.0 for p in pools}
        used = sum(count[p] * each[p] for p in pools)
        if used + cfg.ray.decode_cpus > cpus + 1e-9:
            raise ResourceError(
                f"{asked}: {phrase} x {'/'.join(f'{each[p]:g}' for p in dict.fromkeys(pools))} CPU + "
                f"{cfg.ray.decode_cpus:g} decode = {used + cfg.ray.decode_cpus:g} CPUs, the cluster has {cpus:g}; "
                "use fewer --workers")
        for p in pools:
            plan[p] = {"num_gpus": shares[p], "num_cpus": each[p]}
        if cluster.get("gpu_memory"):  # a local Ray: the GPUs' memory is known before Ray starts
            problem = pool_layout.gpu_memory_problem(cfg, gpus, int(cluster["gpu_memory"]), pools)
            if problem:
                raise ResourceError(f"{asked}: {problem}")
    else:
        share = cpu_share(cfg, cpus, pools)
        if share < MIN_CPU_SHARE:
            fit = max(1, int((max(0.8 * cpus - cfg.ray.decode_cpus, 0.1)) / (len(pools) * MIN_CPU_SHARE)))
            raise ResourceError(
                f"{asked}: {phrase} = {n} actors on {cpus:g} CPUs "
                f"({share:.3f} CPU each, below the {MIN_CPU_SHARE:g} needed to get past model loading); "
                f"use --workers {fit} or a bigger cluster (--address)")
        for p in pools:
            plan[p] = {"num_cpus": pool_layout.cpu_request(cfg, p) or share}
    have = float(cluster.get("memory", 0))
    mem = {p: actor_memory(budget[p]["bytes"] + (working or {}).get(p, 0), p) for p in pools}
    total = sum(count[p] * mem[p] for p in pools)
    if have and total > have:
        per = " + ".join(f"{p} {human_bytes(mem[p])}" for p in pools)
        if len(set(count.values())) == 1:
            k = count[pools[0]]
            what = f"{k} x ({per})"
            fit = max(0, int(have // max(sum(mem.values()), 1)))
        else:
            what = " + ".join(f"{count[p]} x {p} {human_bytes(mem[p])}" for p in pools)
            fit = 0
        hint = f"use --workers {fit}" if fit else "use fewer actors or a machine or cluster (--address) with more memory"
        raise ResourceError(f"{asked}: {what} = {human_bytes(total)} of memory, "
                            f"the cluster has {human_bytes(have)} for actors; {hint}")
    for p in pools:
        plan[p]["memory"] = float(mem[p])
    return plan


def pool_resources(cfg: Config, pool: str, working: int = 0) -> dict[str, float]:
    """Ray resources of one actor of ``pool`` on the connected cluster: a fraction of a GPU (by default
    one GPU hosts one actor of every split pool; on CPU-only clusters a fraction of a CPU so all pools
    fit on a 2-core machine), and ``memory`` from the size of the pool's models (:mod:`adjcap.pools`)
    plus ``working`` bytes the actor holds beyond them. A pool outside the job's layout (the corpus
    encoder) is planned alone. Raises ResourceError when the request can never be granted."""
    cluster = ray.cluster_resources()
    job = tuple(p.name for p in pool_layout.layout(cfg, float(cluster.get("GPU", 0)) > 0))
    pools = job if pool in job else (pool,)
    return pool_plan(cfg, cluster, pools, {pool: working})[pool]


def check_pools(cfg: Config, first: int = 0) -> dict[str, dict[str, float]]:
    """Refuse up front (before any model loads) a request the connected cluster cannot hold; else the
    resources of one actor of every pool the job runs from stage index ``first`` on."""
    return pool_plan(cfg, ray.cluster_resources(), first=first)


def cpu_share(cfg: Config, total: float | None = None, pools: tuple[str, ...] | None = None) -> float:
    """CPUs per actor without GPUs: ``ray.cpu_share``, shrunk so that every actor of ``pools`` (default:
    the split pools) plus the decode tasks fit in the cluster's CPUs (else Ray Data waits forever).
    Actors with their own ``ray.pool.<pool>.cpus`` take theirs first."""
    if total is None:
        total = float(ray.cluster_resources().get("CPU", 1.0))
    pools = pool_layout.pool_names() if pools is None else pools
    # Ray Data stalls when its operators' requests add up to every CPU: keep 20% headroom
    room = max(0.8 * total - cfg.ray.decode_cpus, 0.1)
    fixed = sum(pool_layout.actors(cfg, p) * (pool_layout.cpu_request(cfg, p) or 0.0) for p in pools)
    shared = sum(pool_layout.actors(cfg, p) for p in pools if pool_layout.cpu_request(cfg, p) is None)
    if cfg.verifier.enabled and cfg.verifier.backend == "lavis" and "scorer" in pools:
        shared += pool_layout.actors(cfg, "scorer")  # + the LAVIS scorer pool
    return round(min(float(cfg.ray.cpu_share), max(room - fixed, 0.1) / max(shared, 1)), 4)

"""Connecting to Ray: an embedded local Ray (started and stopped here) or an existing cluster
(``--address``, or the one ``ray job submit`` runs us in).

The embedded local Ray listens on 127.0.0.1 only (GCS, raylet, object manager, workers, agents and,
unless ``ray.dashboard_host`` says otherwise, the dashboard), and its auth token file is made
readable by its owner only (``~/.ray`` 0700, the token 0600).

Beyond connecting, guarding and shutting down, it reads the connected cluster's facts (node types, the
nodes up) as data for the run plan's pools (:class:`adjcap.engine.cluster_plan.PoolPlan`, which plans) and asks
an autoscaler for the nodes that plan needs; it plans nothing itself."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from pathlib import Path
from typing import Iterator

import ray

from adjcap.machine import numerics
from adjcap.machine.accelerators import rocm_visible_env
from adjcap.config import Config
from adjcap.engine.cluster_plan import ClusterPlan, NodeType, PoolPlan, ResourceError, launcher_node_types, merge_up
from adjcap.jobs.ray_guards import ClusterWatch, reap_with_driver

# the directory the workers import this code from: the one holding the ``adjcap`` package (a checkout
# or site-packages). Taken from adjcap/machine/numerics.py, a real file in adjcap/, so resolving it
# is safe; this file's path is not (in a checkout adjcap/jobs links to the repository's jobs/, whose
# grandparent is the checkout's parent: docs/architecture.md, "One layout").
ROOT = Path(numerics.__file__).resolve().parents[2]
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
        try:
            yield
        finally:
            release_request()
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
            release_request()
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


def pool_resources(pools: PoolPlan, pool: str, working: int = 0) -> dict[str, float]:
    """Ray resources of one actor of ``pool`` on the connected cluster (:meth:`PoolPlan.on_node`: the
    pool's share of the job's layout, or a pool outside it, the corpus encoder, alone, holding ``working``
    bytes beyond its models). Raises ResourceError when the request can never be granted."""
    return pools.on_node(ray.cluster_resources(), pool, working)[pool]


def check_pools(pools: PoolPlan, first: int = 0) -> dict[str, dict[str, float]]:
    """Refuse up front (before any model loads) a request no node type of the connected cluster can hold;
    on an autoscaling cluster, ask for the nodes the plan needs and wait for them (:func:`scale_up`); then
    the resources of one actor of every pool the job runs from stage index ``first`` on."""
    plan = pools.on_cluster(cluster_facts(pools.cfg)[0], first)
    if plan.waiting:
        plan = scale_up(pools, plan, first)
    return {p: dict(plan.actor[p]) for p in plan.pools}


# --- the cluster's facts, as data for the run plan's pools (adjcap.engine.cluster_plan) ------------------------------------------------

BOOTSTRAP_CONFIG = "~/ray_bootstrap_config.yaml"  # where the cluster launcher puts its config on the head


def _nodes_up() -> list[tuple[str, dict[str, float]]]:
    """(node type name or "", total resources) of every node alive now."""
    try:
        from ray._raylet import GcsClient
        from ray.autoscaler.v2.sdk import get_cluster_resource_state
        from ray.core.generated.autoscaler_pb2 import NodeStatus

        state = get_cluster_resource_state(GcsClient(address=ray.get_runtime_context().gcs_address))
        return [(n.ray_node_type_name, dict(n.total_resources)) for n in state.node_states
                if n.status in (NodeStatus.RUNNING, NodeStatus.IDLE)]
    except Exception:  # noqa: BLE001 - another Ray: the node table, without type names
        return [("", dict(n["Resources"])) for n in ray.nodes() if n.get("Alive")]


def _gcs_node_types() -> list[NodeType]:
    """The node groups an autoscaler reported to the GCS (Ray's ClusterConfig), if any."""
    try:
        from ray._private.state import state

        conf = state.get_cluster_config()
    except Exception:  # noqa: BLE001
        return []
    out = []
    for g in getattr(conf, "node_group_configs", None) or []:
        r = dict(g.resources)
        out.append(NodeType(g.name, float(r.get("CPU", 0)), float(r.get("GPU", 0)), float(r.get("memory", 0)),
                            None if g.max_count == -1 else int(g.max_count)))
    return out


def _launcher_node_types(cfg: Config) -> list[NodeType]:
    import yaml

    path = Path(os.path.expanduser(cfg.ray.autoscaler_config or BOOTSTRAP_CONFIG))
    if not path.is_file():
        if cfg.ray.autoscaler_config:
            raise ResourceError(f"ray.autoscaler_config: no such file {path}; give the cluster launcher's config")
        return []
    try:
        return launcher_node_types(yaml.safe_load(path.read_text()) or {})
    except (yaml.YAMLError, AttributeError, TypeError, ValueError) as e:
        raise ResourceError(f"{path}: not a cluster launcher config ({e}); fix it or set ray.autoscaler_config") from None


def _has_autoscaler() -> bool:
    """Whether an autoscaler watches this cluster (the v1 monitor's status, or v2's reported state)."""
    try:
        from ray._private import ray_constants
        from ray.experimental.internal_kv import _internal_kv_get

        if _internal_kv_get(ray_constants.DEBUG_AUTOSCALING_STATUS):
            return True
        from ray._raylet import GcsClient
        from ray.core.generated.autoscaler_pb2 import GetClusterStatusReply

        reply = GetClusterStatusReply()
        reply.ParseFromString(GcsClient(address=ray.get_runtime_context().gcs_address).get_cluster_status(timeout_s=5))
        return reply.autoscaling_state.autoscaler_state_version > 0
    except Exception:  # noqa: BLE001
        return False


def cluster_facts(cfg: Config) -> tuple[tuple[NodeType, ...], bool]:
    """(the connected cluster's node types, up and addable; whether an autoscaler can add nodes): the node
    types from the GCS (Ray's ClusterConfig), else the cluster launcher's config; with neither, the shapes of
    the nodes up (an autoscaler present: any number of each)."""
    types = _gcs_node_types() or _launcher_node_types(cfg)
    autoscaling = bool(types) or _has_autoscaler()
    return merge_up(types, _nodes_up(), autoscaling), autoscaling


# --- asking the autoscaler and waiting -------------------------------------------------------------------

_asked_autoscaler = False
POLL_S = 2.0


def scale_up(pools: PoolPlan, plan: ClusterPlan, first: int = 0) -> ClusterPlan:
    """Ask the autoscaler for one bundle per actor (``request_resources``) and wait, on one progress line
    ("waiting for 8 GPU workers: 2 up, 6 pending"), until the nodes up hold the plan; past
    ``ray.scale_wait_s`` a ResourceError names what never came. The request is withdrawn when the Ray
    session ends (:func:`release_request`)."""
    import sys
    import time

    from ray.autoscaler.sdk import request_resources

    global _asked_autoscaler
    cfg = pools.cfg
    request_resources(bundles=plan.bundles())
    _asked_autoscaler = True
    deadline = time.monotonic() + cfg.ray.scale_wait_s
    tty = sys.stdout.isatty()
    line = plan.progress()
    print(line, end="\r" if tty else "\n", flush=True)
    while plan.waiting:
        if time.monotonic() >= deadline:
            if tty:
                print()
            missing = ", ".join(f"{k} x {n}" for n, k in plan.missing().items())  # "6 x ray.worker.l4"
            raise ResourceError(
                f"waited {cfg.ray.scale_wait_s:g} s (ray.scale_wait_s) for the nodes the plan asked for: "
                f"{line.removeprefix('waiting for ')}; never came: {missing} (`ray status` shows the autoscaler's "
                "view: a node type's quota, capacity or launch failures)")
        time.sleep(POLL_S)
        plan = pools.on_cluster(cluster_facts(cfg)[0], first)
        if plan.progress() != line:
            line = plan.progress()
            if tty:
                print(f"\x1b[2K{line}", end="\r", flush=True)
    if tty:
        print()
    return plan


def release_request() -> None:
    """Withdraw what :func:`scale_up` asked the autoscaler for, so that it can remove the nodes when idle."""
    global _asked_autoscaler
    if not _asked_autoscaler:
        return
    _asked_autoscaler = False
    try:
        from ray.autoscaler.sdk import request_resources

        request_resources(bundles=[])
    except Exception:  # noqa: BLE001 - the cluster is gone: nothing to withdraw
        pass

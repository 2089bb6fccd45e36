"""The job's plan for the cluster it runs on and the cluster it can become (docs/architecture.md, "Pools").

Pure: the cluster's facts come in as data (:class:`NodeType`: one node's CPUs, GPUs, memory for actors and
GPU memory, how many such nodes are up and how many the cluster can have), read from Ray by
``jobs/ray_session.py``. From them and the config (``--workers``, the preset, ``ray.pool.*``) the plan
says whether the job runs on GPUs (a node type with GPUs the cluster has or can add), its pools, one
actor's Ray resources per pool, and the nodes of each type that hold every actor. Actors are placed node
by node (first fit, set by set: one actor of each pool, then the next set): a node's memory holds only the
actors placed on it, so a GPU-less head's memory never counts for a GPU actor. A request no node type can ever hold is refused in one line
(:class:`ResourceError`); one that the cluster's node types can hold once the autoscaler adds them is
returned with the nodes it needs (``ClusterPlan.waiting``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Mapping, Sequence

from adjcap import pools as pool_layout
from adjcap.config import Config
from adjcap.models.budget import human_bytes

GiB = 2**30


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
# the share of a node's memory Ray offers tasks and actors: the rest is its object store (Ray's
# DEFAULT_OBJECT_STORE_MEMORY_PROPORTION, 0.3, as the cluster launcher fills a node type's `memory`)
RAY_MEMORY_SHARE = 0.7


def ray_memory(ram_bytes: float) -> float:
    """The ``memory`` resource Ray gives a node (or pod limit) of ``ram_bytes``."""
    return RAY_MEMORY_SHARE * ram_bytes


@dataclass(frozen=True)
class NodeType:
    """One kind of node: what one node offers (``memory``: Ray's memory resource, bytes for actors;
    ``gpu_memory``: bytes of one GPU, 0 when unknown), how many are ``up`` now and how many the
    cluster can have (``max_count``; None: no limit known, an autoscaler decides)."""

    name: str
    cpus: float
    gpus: float = 0.0
    memory: float = 0.0
    max_count: int | None = 1
    up: int = 0
    gpu_memory: float = 0.0

    def describe(self) -> str:
        n = "any number" if self.max_count is None else f"{self.max_count}"
        gpu = f", {self.gpus:g} GPU" if self.gpus else ", no GPU"
        return f"{self.name} ({self.cpus:g} CPU{gpu}, {human_bytes(self.memory)} for actors; up to {n})"


# the L4 nodes the recipes and docs/guide/presets.md name: vCPUs, GPUs, host RAM, one L4's memory
L4_GPU_BYTES = 22.5 * GiB  # what torch reports of an L4's 24 GB
NODE_SHAPES = {
    "g6.xlarge": (4, 1, 16 * GiB, L4_GPU_BYTES),
    "g6.2xlarge": (8, 1, 32 * GiB, L4_GPU_BYTES),
    "g6.4xlarge": (16, 1, 64 * GiB, L4_GPU_BYTES),
    "g6.12xlarge": (48, 4, 192 * GiB, L4_GPU_BYTES),
    "m6i.2xlarge": (8, 0, 32 * GiB, 0.0),
}


def shape_type(name: str, instance: str, max_count: int | None = 1, up: int = 0) -> NodeType:
    """A node type of a known instance shape (:data:`NODE_SHAPES`), Ray's memory share of its RAM."""
    cpus, gpus, ram, gpu_mem = NODE_SHAPES[instance]
    return NodeType(name, cpus, gpus, ray_memory(ram), max_count, up, gpu_mem)


def launcher_node_types(conf: Mapping) -> list[NodeType]:
    """The node types of a cluster launcher config (``available_node_types``): each type's ``resources``
    (CPU, GPU, memory) where given, else its instance's known shape (:data:`NODE_SHAPES`),
    ``max_workers`` nodes (the head: one)."""
    out = []
    head = conf.get("head_node_type")
    for name, t in (conf.get("available_node_types") or {}).items():
        r = dict(t.get("resources") or {})
        shape = NODE_SHAPES.get(str((t.get("node_config") or {}).get("InstanceType", "")))
        cpus = float(r.get("CPU", shape[0] if shape else 0))
        gpus = float(r.get("GPU", shape[1] if shape else 0))
        memory = float(r.get("memory", ray_memory(shape[2]) if shape else 0))
        gpu_memory = float(shape[3]) if shape and gpus else 0.0
        count = 1 if name == head else int(t.get("max_workers", conf.get("max_workers", 0)))
        out.append(NodeType(name, cpus, gpus, memory, count, 0, gpu_memory))
    return out


@dataclass(frozen=True)
class ClusterPlan:
    """What the job runs and where: ``gpu`` (a plan on GPUs), its ``pools`` in stream order, one actor's Ray
    resources per pool (``actor``), the actors per pool (``count``) and the nodes of each type that hold
    them all (``nodes``, up ones included)."""

    gpu: bool
    pools: tuple[str, ...]
    actor: Mapping[str, Mapping[str, float]]
    count: Mapping[str, int]
    nodes: Mapping[str, int] = field(default_factory=dict)
    types: tuple[NodeType, ...] = ()

    def bundles(self) -> list[dict[str, float]]:
        """One resource bundle per actor (CPUs and GPUs), what the job asks the autoscaler for."""
        out = []
        for p in self.pools:
            r = self.actor[p]
            b = {"CPU": float(r["num_cpus"])}
            if r.get("num_gpus"):
                b["GPU"] = float(r["num_gpus"])
            out += [b] * self.count[p]
        return out

    def missing(self) -> dict[str, int]:
        """Nodes of each type the plan needs beyond those up."""
        up = {t.name: t.up for t in self.types}
        return {n: k - up.get(n, 0) for n, k in self.nodes.items() if k > up.get(n, 0)}

    @property
    def waiting(self) -> bool:
        return bool(self.missing())

    def gpu_nodes(self) -> tuple[int, int]:
        """(GPU nodes the plan needs, GPU nodes up of those types)."""
        gpu = {t.name: t for t in self.types if t.gpus}
        need = sum(k for n, k in self.nodes.items() if n in gpu)
        return need, sum(min(gpu[n].up, k) for n, k in self.nodes.items() if n in gpu)

    def progress(self) -> str:
        """"waiting for 8 GPU workers: 2 up, 6 pending" (or nodes, on a plan without GPUs)."""
        if self.gpu:
            need, up = self.gpu_nodes()
            what = "GPU workers"
        else:
            need, up = sum(self.nodes.values()), sum(min(t.up, self.nodes.get(t.name, 0)) for t in self.types)
            what = "nodes"
        return f"waiting for {need} {what}: {up} up, {need - up} pending"


def actor_memory(model_bytes: int, pool: str = "") -> int:
    """Host memory one actor asks Ray for: the worker process (a fused actor's is larger) plus its models
    at run precision."""
    base = FUSED_BASE_BYTES if pool == pool_layout.FUSED else ACTOR_BASE_BYTES
    return int(WORKING_FACTOR * (base + model_bytes))


def _actors_phrase(pools: tuple[str, ...], count: Mapping[str, int]) -> str:
    """"4 pools x 2 actors" (every pool alike) or "retriever 1 + captioner 3 actors"."""
    if len(set(count.values())) <= 1:
        k = count[pools[0]] if pools else 0
        return f"{len(pools)} pool{'s' if len(pools) != 1 else ''} x {k} actors"
    return " + ".join(f"{p} {count[p]}" for p in pools) + " actors"


def _asked(cfg: Config, pools: tuple[str, ...], count: Mapping[str, int]) -> str:
    """Who asked: ``--workers N`` when every pool has ``ray.workers`` actors, else the pools' own counts."""
    return f"--workers {cfg.ray.workers}" if all(count[p] == cfg.ray.workers for p in pools) else "ray.pool.<pool>.actors"


def cpu_share(cfg: Config, total: float, pools: tuple[str, ...] | None = None) -> float:
    """CPUs per actor without GPUs: ``ray.cpu_share``, shrunk so that every actor of ``pools`` (default:
    the split pools) plus the decode tasks fit in ``total`` CPUs (else Ray Data waits forever).
    Actors with their own ``ray.pool.<pool>.cpus`` take theirs first."""
    pools = pool_layout.pool_names() if pools is None else pools
    # Ray Data stalls when its operators' requests add up to every CPU: keep 20% headroom
    room = max(0.8 * total - cfg.ray.decode_cpus, 0.1)
    fixed = sum(pool_layout.actors(cfg, p) * (pool_layout.cpu_request(cfg, p) or 0.0) for p in pools)
    shared = sum(pool_layout.actors(cfg, p) for p in pools if pool_layout.cpu_request(cfg, p) is None)
    shared += pool_layout.part_actors(cfg, pools)  # + the pools running an isolated family's part (LAVIS's)
    return round(min(float(cfg.ray.cpu_share), max(room - fixed, 0.1) / max(shared, 1)), 4)


def pool_plan(cfg: Config, cluster: Mapping[str, float], pools: tuple[str, ...] | None = None,
              working: Mapping[str, int] | None = None, first: int = 0) -> dict[str, dict[str, float]]:
    """The Ray resources of one actor of every pool in ``pools`` (default: the pools the job runs on
    this cluster from stage index ``first`` on, split or fused: :func:`adjcap.pools.layout`) on one node
    (or a cluster summed as one) with ``cluster`` resources (``ray.cluster_resources()``: CPU, GPU,
    memory, and ``gpu_memory`` where known), or a ResourceError when the pools' actors
    (:func:`adjcap.pools.actors`) can never be placed: too many CPUs, GPUs or bytes of memory asked for
    (``memory`` 0 or absent: not checked). A fused actor asks for the memory of every model it holds,
    each once."""
    gpu = float(cluster.get("GPU", 0)) > 0
    if pools is None:
        pools = tuple(dict.fromkeys(p.name for p in pool_layout.layout(cfg, gpu, first)))
    budget = pool_layout.pool_budget(cfg, gpu=gpu)
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


@dataclass
class _Node:
    type: NodeType
    cpus: float
    gpus: float
    memory: float
    gpu_bytes: float


def _fits(node: _Node, need: Mapping[str, float]) -> bool:
    return (need["CPU"] <= node.cpus + 1e-9 and need["GPU"] <= node.gpus + 1e-9 and need["memory"] <= node.memory
            and need["gpu_bytes"] <= node.gpu_bytes)


def _open(t: NodeType) -> _Node:
    gpu_bytes = t.gpus * t.gpu_memory if t.gpu_memory else float("inf")
    return _Node(t, t.cpus, t.gpus, t.memory or float("inf"), gpu_bytes)


def place(needs: Sequence[Mapping[str, float]], types: Sequence[NodeType], up_only: bool = False) -> dict[str, int] | None:
    """Nodes of each type that hold every actor of ``needs`` (CPU, GPU, memory and GPU bytes each), first
    fit in the order given (set by set: a node holds whole sets of actors where it can), nodes that are up
    opened before new ones; None when the types' counts (with ``up_only``: the nodes up) cannot hold them."""
    nodes: list[_Node] = []
    opened: Counter = Counter()
    for r in needs:
        for nd in nodes:
            if _fits(nd, r):
                break
        else:
            for t in sorted(types, key=lambda t: opened[t.name] >= t.up):  # up nodes first
                limit = t.up if up_only else t.max_count
                if (limit is None or opened[t.name] < limit) and _fits(_open(t), r):
                    nd = _open(t)
                    nodes.append(nd)
                    opened[t.name] += 1
                    break
            else:
                return None
        nd.cpus -= r["CPU"]
        nd.gpus -= r["GPU"]
        nd.memory -= r["memory"]
        nd.gpu_bytes -= r["gpu_bytes"]
    return dict(opened)


def _needs(actor: Mapping[str, Mapping[str, float]], count: Mapping[str, int], gpu_bytes: Mapping[str, float]):
    """Every actor's needs, set by set (one actor of each pool, then the next set)."""
    one = {p: {"CPU": float(r.get("num_cpus", 0.0)), "GPU": float(r.get("num_gpus", 0.0)),
               "memory": float(r["memory"]), "gpu_bytes": gpu_bytes.get(p, 0.0)} for p, r in actor.items()}
    return [one[p] for k in range(max(count.values(), default=0)) for p in actor if k < count[p]]


def _can_have(types: Sequence[NodeType], key: str) -> float:
    return sum(getattr(t, key) * (t.max_count if t.max_count is not None else 10**6) for t in types)


def plan_cluster(cfg: Config, types: Sequence[NodeType], first: int = 0,
                 working: Mapping[str, int] | None = None) -> ClusterPlan:
    """The job's plan (``cfg`` resolved) on a cluster of node ``types`` (those up and those the autoscaler
    can add): GPUs when some type has them, the pools of :func:`adjcap.pools.layout`, one actor's
    resources per pool (:func:`pool_plan` against everything the cluster can have, GPU memory checked
    against its smallest GPU), then every actor placed on a node that holds it, set by set (:func:`place`). Raises
    ResourceError, in one line, only for what no node type can ever hold."""
    types = tuple(t for t in types if t.max_count is None or t.max_count > 0 or t.up > 0)
    gpu_types = [t for t in types if t.gpus > 0]
    gpu = bool(gpu_types)
    pools = tuple(dict.fromkeys(p.name for p in pool_layout.layout(cfg, gpu, first)))
    count = {p: pool_layout.actors(cfg, p) for p in pools}
    whole = {"CPU": _can_have(types, "cpus"), "GPU": _can_have(types, "gpus")}
    gpu_mem = [t.gpu_memory for t in gpu_types if t.gpu_memory]
    if gpu_mem:
        whole["gpu_memory"] = min(gpu_mem)
    if not gpu:  # CPU shares are sized to the CPUs there are, not to those the autoscaler could add
        whole["CPU"] = sum(t.cpus * max(t.up, 1) for t in types)
    actor = pool_plan(cfg, whole, pools, working)
    budget = pool_layout.pool_budget(cfg, gpu=True) if gpu else {}
    gpu_bytes = {p: float(budget[p]["bytes"]) for p in pools} if gpu else {}
    asked, phrase = _asked(cfg, pools, count), _actors_phrase(pools, count)
    where = "; ".join(t.describe() for t in types)
    for p in pools:  # one actor that no node type can hold
        one = _needs({p: actor[p]}, {p: 1}, gpu_bytes)[0]
        if not any(_fits(_open(t), one) for t in types):
            gpu_part = f", {one['GPU']:g} GPU, {human_bytes(one['gpu_bytes'])} of GPU memory" if gpu else ""
            raise ResourceError(
                f"{asked}: one {p} actor needs {one['CPU']:g} CPU{gpu_part} and {human_bytes(one['memory'])} of "
                f"memory on one node, and no node type holds it ({where}); use a node type with more memory "
                "(docs/guide/presets.md, \"Node shapes\") or a smaller preset")
    nodes = place(_needs(actor, count, gpu_bytes), types)
    if nodes is None:
        fit = 0
        if all(count[p] == cfg.ray.workers for p in pools):
            for k in range(cfg.ray.workers - 1, 0, -1):
                if place(_needs(actor, {p: k for p in pools}, gpu_bytes), types) is not None:
                    fit = k
                    break
        per = " + ".join(f"{p} {human_bytes(actor[p]['memory'])}" for p in pools)
        hint = f"use --workers {fit}" if fit else "use fewer actors"
        raise ResourceError(f"{asked}: {phrase} ({per} of memory each) do not fit on the nodes the cluster "
                            f"can have ({where}); {hint} or raise the node types' max workers")
    return ClusterPlan(gpu, pools, actor, count, nodes, types)


def _shape_key(r: Mapping[str, float]) -> tuple[float, float]:
    return float(r.get("CPU", 0)), float(r.get("GPU", 0))


def merge_up(types: Sequence[NodeType], up: Sequence[tuple[str, Mapping[str, float]]],
             autoscaling: bool) -> tuple[NodeType, ...]:
    """The node types with the nodes ``up`` ((type name or "", total resources) each) counted in (by type
    name, else by CPU/GPU shape); a node of no known type becomes a type of its own (its real resources;
    without an autoscaler, as many as are up)."""
    count: dict[str, int] = {}
    extra: dict[tuple, list[Mapping[str, float]]] = {}
    by_name = {t.name: t for t in types}
    for name, r in up:
        t = by_name.get(name) or next((t for t in types if _shape_key(r) == (t.cpus, t.gpus)), None)
        if t is not None:
            count[t.name] = count.get(t.name, 0) + 1
        else:
            extra.setdefault(_shape_key(r), []).append(r)
    out = [NodeType(t.name, t.cpus, t.gpus, t.memory, t.max_count if t.max_count is None else max(t.max_count, count.get(t.name, 0)),
                    count.get(t.name, 0), t.gpu_memory) for t in types]
    for (cpus, gpus), rs in extra.items():
        name = f"{cpus:g}-CPU{f' {gpus:g}-GPU' if gpus else ''} node"
        out.append(NodeType(name, cpus, gpus, min(float(r.get("memory", 0)) for r in rs),
                            None if autoscaling and not types else len(rs), len(rs)))
    return tuple(out)


@dataclass(frozen=True)
class PoolPlan:
    """The pools a job may run, decided once from the (resolved) config ``cfg``; a job's run plan holds it
    and the job reads its pools from it alone: the layout on a cluster without GPUs and on one with them
    (which one runs is the connected cluster's to say: :attr:`ClusterPlan.gpu`), each pool's stages, actor
    class name, actors, batch size and runtime environment (:class:`adjcap.pools.Pool`); the Ray resources
    of one actor of each on the cluster's facts (:meth:`on_cluster`, :meth:`on_node`). Pure."""

    cfg: Config
    without_gpus: tuple[pool_layout.Pool, ...]
    with_gpus: tuple[pool_layout.Pool, ...]

    @classmethod
    def of(cls, cfg: Config) -> "PoolPlan":
        """The pool plan of a resolved config; an unknown ``ray.pool.<name>`` (or a missing isolated
        environment) is refused here."""
        return cls(cfg, *(tuple(pool_layout.layout(cfg, gpu)) for gpu in (False, True)))

    @property
    def actors(self) -> Mapping[str, int]:
        """Actors of every pool either layout runs, by pool name."""
        return MappingProxyType({p.name: p.actors for p in (*self.without_gpus, *self.with_gpus)})

    def layout(self, gpu: bool, first: int = 0) -> list[pool_layout.Pool]:
        """The pools, in stream order, for images that need the stages from index ``first`` on."""
        from adjcap.stage_registry import names

        keep = names()[first:]
        return [q for p in (self.with_gpus if gpu else self.without_gpus) if (q := p.from_stage(keep))]

    def decode_batch(self, gpu: bool) -> int:
        """Images per batch of the decode tasks (:func:`adjcap.pools.batch_size`)."""
        return pool_layout.batch_size(self.cfg, None, gpu)

    def on_cluster(self, types: Sequence[NodeType], first: int = 0) -> ClusterPlan:
        """The plan on a cluster of node ``types`` (:func:`plan_cluster`)."""
        return plan_cluster(self.cfg, types, first)

    def on_node(self, cluster: Mapping[str, float], pool: str | None = None, working: int = 0) -> dict[str, dict[str, float]]:
        """One actor's Ray resources per pool on one node (or a cluster summed as one) of ``cluster``
        resources (:func:`pool_plan`): every pool of the layout, or, with ``pool``, that pool's actor holding
        ``working`` bytes beyond its models (a pool outside the layout, the corpus encoder, planned alone)."""
        if pool is None:
            return pool_plan(self.cfg, cluster)
        job = tuple(dict.fromkeys(p.name for p in self.layout(float(cluster.get("GPU", 0)) > 0)))
        return pool_plan(self.cfg, cluster, job if pool in job else (pool,), {pool: working})


def with_up(types: Sequence[NodeType], up: Mapping[str, int]) -> tuple[NodeType, ...]:
    """The same node types with ``up`` nodes of each now."""
    return tuple(replace(t, up=up.get(t.name, 0)) for t in types)

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

A job's run plan holds its :class:`PoolPlan`: the config read once (:func:`adjcap.engine.pools.read`) into the
layouts and each pool's :class:`adjcap.engine.pools.Share`; the planning here reads that, never the config, and
the job reaches it only through the plan (``PoolPlan.on_cluster``, ``PoolPlan.on_node``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Mapping, Sequence

from adjcap.engine import pools as pool_layout
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


def _asked(workers: int, pools: tuple[str, ...], count: Mapping[str, int]) -> str:
    """Who asked: ``--workers N`` when every pool has ``ray.workers`` actors, else the pools' own counts."""
    return f"--workers {workers}" if all(count[p] == workers for p in pools) else "ray.pool.<pool>.actors"


def _of(plan: "PoolPlan | Config") -> "PoolPlan":
    return plan if isinstance(plan, PoolPlan) else PoolPlan.of(plan)


def cpu_share(plan: "PoolPlan | Config", total: float, pools: tuple[str, ...] | None = None) -> float:
    """CPUs per actor without GPUs: ``ray.cpu_share``, shrunk so that every actor of ``pools`` (default:
    the split pools) plus the decode tasks fit in ``total`` CPUs (else Ray Data waits forever).
    Actors with their own ``ray.pool.<pool>.cpus`` take theirs first; the pools running an isolated
    family's part of a pool's stages (LAVIS's) share with the others."""
    plan = _of(plan)
    sh = [plan.shares[p] for p in (pool_layout.pool_names() if pools is None else pools)]
    # Ray Data stalls when its operators' requests add up to every CPU: keep 20% headroom
    room = max(0.8 * total - plan.decode_cpus, 0.1)
    fixed = sum(s.actors * (s.cpus or 0.0) for s in sh)
    shared = sum(s.actors for s in sh if s.cpus is None) + sum(s.part_actors for s in sh)
    return round(min(plan.cpu_default, max(room - fixed, 0.1) / max(shared, 1)), 4)


def gpu_memory_problem(plan: "PoolPlan | Config", gpus: float, gpu_bytes: int, pools: Sequence[str]) -> str | None:
    """Why the models of ``pools`` (each pool's actors) cannot fit on ``gpus`` GPUs of ``gpu_bytes`` each,
    counted at the precision each model loads in, or None: one actor's models larger than a whole GPU, or
    every actor's together larger than all of them."""
    sh = _of(plan).shares
    for p in pools:
        need = sh[p].gpu_bytes
        if need > gpu_bytes:
            return (f"pool {p}: one actor's models take {human_bytes(need)} of GPU memory at the precision "
                    f"they load in, more than a whole GPU ({human_bytes(gpu_bytes)}); use precision=bf16 "
                    "or a larger GPU")
    total = sum(sh[p].actors * sh[p].gpu_bytes for p in pools)
    if total > gpus * gpu_bytes:
        per = " + ".join(f"{sh[p].actors} x {p} {human_bytes(sh[p].gpu_bytes)}" for p in pools)
        return (f"the pools' models take {per} = {human_bytes(total)} of GPU memory, the "
                f"{gpus:g} GPU(s) have {human_bytes(gpus * gpu_bytes)}; use fewer actors or precision=bf16")
    return None


def _job_pools(plan: "PoolPlan", gpu: bool, first: int) -> tuple[str, ...]:
    return tuple(dict.fromkeys(p.name for p in plan.layout(gpu, first)))


def pool_plan(plan: "PoolPlan | Config", cluster: Mapping[str, float], pools: tuple[str, ...] | None = None,
              working: Mapping[str, int] | None = None, first: int = 0) -> dict[str, dict[str, float]]:
    """The Ray resources of one actor of every pool in ``pools`` (default: the pools the job runs on
    this cluster from stage index ``first`` on, split or fused: :meth:`PoolPlan.layout`) on one node
    (or a cluster summed as one) with ``cluster`` resources (``ray.cluster_resources()``: CPU, GPU,
    memory, and ``gpu_memory`` where known), or a ResourceError when the pools' actors can never be
    placed: too many CPUs, GPUs or bytes of memory asked for (``memory`` 0 or absent: not checked). A
    fused actor asks for the memory of every model it holds, each once. ``plan``: the run plan's pools
    (a resolved config: its plan)."""
    plan = _of(plan)
    sh = plan.shares
    gpu = float(cluster.get("GPU", 0)) > 0
    if pools is None:
        pools = _job_pools(plan, gpu, first)
    cpus = float(cluster.get("CPU", 1.0))
    decode = plan.decode_cpus
    count = {p: sh[p].actors for p in pools}
    asked, phrase = _asked(plan.workers, pools, count), _actors_phrase(pools, count)
    n = sum(count.values())
    out: dict[str, dict[str, float]] = {}
    if gpu:
        gpus = float(cluster["GPU"])
        shares = {p: sh[p].gpus for p in pools}
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
        each = {p: sh[p].cpus or 1.0 for p in pools}
        used = sum(count[p] * each[p] for p in pools)
        if used + decode > cpus + 1e-9:
            raise ResourceError(
                f"{asked}: {phrase} x {'/'.join(f'{each[p]:g}' for p in dict.fromkeys(pools))} CPU + "
                f"{decode:g} decode = {used + decode:g} CPUs, the cluster has {cpus:g}; "
                "use fewer --workers")
        for p in pools:
            out[p] = {"num_gpus": shares[p], "num_cpus": each[p]}
        if cluster.get("gpu_memory"):  # a local Ray: the GPUs' memory is known before Ray starts
            problem = gpu_memory_problem(plan, gpus, int(cluster["gpu_memory"]), pools)
            if problem:
                raise ResourceError(f"{asked}: {problem}")
    else:
        share = cpu_share(plan, cpus, pools)
        if share < MIN_CPU_SHARE:
            fit = max(1, int((max(0.8 * cpus - decode, 0.1)) / (len(pools) * MIN_CPU_SHARE)))
            raise ResourceError(
                f"{asked}: {phrase} = {n} actors on {cpus:g} CPUs "
                f"({share:.3f} CPU each, below the {MIN_CPU_SHARE:g} needed to get past model loading); "
                f"use --workers {fit} or a bigger cluster (--address)")
        for p in pools:
            out[p] = {"num_cpus": sh[p].cpus or share}
    have = float(cluster.get("memory", 0))
    mem = {p: actor_memory((sh[p].gpu_bytes if gpu else sh[p].cpu_bytes) + (working or {}).get(p, 0), p)
           for p in pools}
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
        out[p]["memory"] = float(mem[p])
    return out


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


def plan_cluster(plan: "PoolPlan | Config", types: Sequence[NodeType], first: int = 0,
                 working: Mapping[str, int] | None = None) -> ClusterPlan:
    """The job's plan (the run plan's pools, or a resolved config's) on a cluster of node ``types`` (those
    up and those the autoscaler can add): GPUs when some type has them, the pools of
    :meth:`PoolPlan.layout`, one actor's resources per pool (:func:`pool_plan` against everything the
    cluster can have, GPU memory checked against its smallest GPU), then every actor placed on a node that
    holds it, set by set (:func:`place`). Raises ResourceError, in one line, only for what no node type can
    ever hold."""
    plan = _of(plan)
    types = tuple(t for t in types if t.max_count is None or t.max_count > 0 or t.up > 0)
    gpu_types = [t for t in types if t.gpus > 0]
    gpu = bool(gpu_types)
    pools = _job_pools(plan, gpu, first)
    count = {p: plan.shares[p].actors for p in pools}
    whole = {"CPU": _can_have(types, "cpus"), "GPU": _can_have(types, "gpus")}
    gpu_mem = [t.gpu_memory for t in gpu_types if t.gpu_memory]
    if gpu_mem:
        whole["gpu_memory"] = min(gpu_mem)
    if not gpu:  # CPU shares are sized to the CPUs there are, not to those the autoscaler could add
        whole["CPU"] = sum(t.cpus * max(t.up, 1) for t in types)
    actor = pool_plan(plan, whole, pools, working)
    gpu_bytes = {p: float(plan.shares[p].gpu_bytes) for p in pools} if gpu else {}
    asked, phrase = _asked(plan.workers, pools, count), _actors_phrase(pools, count)
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
        if all(count[p] == plan.workers for p in pools):
            for k in range(plan.workers - 1, 0, -1):
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
    """The pools a job may run, decided once from the (resolved) config ``cfg``, which is read here and
    nowhere after: a job's run plan holds it and the job reads its pools from it alone. ``layouts``: the
    pools, in stream order, by (a cluster with GPUs?, the first stage index some image needs): which GPU
    case runs is the connected cluster's to say (:attr:`ClusterPlan.gpu`); each pool's stages, actor
    class name, actors, batch size and runtime environment (:class:`adjcap.engine.pools.Pool`). ``shares``: what
    one actor of each pool asks of a cluster (:class:`adjcap.engine.pools.Share`); with the decode tasks' CPUs
    and batch sizes, ``ray.workers`` and ``ray.cpu_share``, everything :func:`pool_plan` and
    :func:`plan_cluster` need to give each actor's Ray resources on the cluster's facts
    (:meth:`on_cluster`, :meth:`on_node`). Pure."""

    cfg: Config
    layouts: Mapping[tuple[bool, int], tuple[pool_layout.Pool, ...]]
    shares: Mapping[str, pool_layout.Share]
    workers: int
    cpu_default: float
    decode_cpus: float
    decode_batches: Mapping[bool, int]

    @classmethod
    def of(cls, cfg: Config) -> "PoolPlan":
        """The pool plan of a resolved config; an unknown ``ray.pool.<name>`` (or a missing isolated
        environment) is refused here."""
        layouts, shares, decode = pool_layout.read(cfg)
        return cls(cfg, MappingProxyType(layouts), MappingProxyType(shares), cfg.ray.workers,
                   float(cfg.ray.cpu_share), float(cfg.ray.decode_cpus), MappingProxyType(decode))

    @property
    def actors(self) -> Mapping[str, int]:
        """Actors of every pool either layout runs, by pool name."""
        return MappingProxyType({p.name: p.actors for ps in self.layouts.values() for p in ps})

    def layout(self, gpu: bool, first: int = 0) -> list[pool_layout.Pool]:
        """The pools, in stream order, for images that need the stages from index ``first`` on."""
        return list(self.layouts[(gpu, first)])

    def decode_batch(self, gpu: bool) -> int:
        """Images per batch of the decode tasks (:func:`adjcap.engine.pools.batch_size`)."""
        return self.decode_batches[gpu]

    def on_cluster(self, types: Sequence[NodeType], first: int = 0) -> ClusterPlan:
        """The plan on a cluster of node ``types`` (:func:`plan_cluster`)."""
        return plan_cluster(self, types, first)

    def on_node(self, cluster: Mapping[str, float], pool: str | None = None, working: int = 0) -> dict[str, dict[str, float]]:
        """One actor's Ray resources per pool on one node (or a cluster summed as one) of ``cluster``
        resources (:func:`pool_plan`): every pool of the layout, or, with ``pool``, that pool's actor holding
        ``working`` bytes beyond its models (a pool outside the layout, the corpus encoder, planned alone)."""
        if pool is None:
            return pool_plan(self, cluster)
        job = _job_pools(self, float(cluster.get("GPU", 0)) > 0, 0)
        return pool_plan(self, cluster, job if pool in job else (pool,), {pool: working})


def with_up(types: Sequence[NodeType], up: Mapping[str, int]) -> tuple[NodeType, ...]:
    """The same node types with ``up`` nodes of each now."""
    return tuple(replace(t, up=up.get(t.name, 0)) for t in types)

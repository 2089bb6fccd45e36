"""The Ray backend of :class:`adjcap.engine.executor.Executor`: the stream as a Ray dataset, the decode
step as bounded CPU tasks (``actors/decode.py``) and each pool as a Ray Data actor pool of its actor
class (``actors/pool.py``: :class:`adjcap.engine.pool_batch.PoolBatch` as an actor), with the
resources the run's pool plan gives it. The caption index and the corpus nouns are put into the
object store once per job."""

from __future__ import annotations

import time
from typing import Any, Iterator

import pyarrow as pa
import ray
from ray.data import ActorPoolStrategy, TaskPoolStrategy

from adjcap.engine import stage_registry
from adjcap.actors.decode import decode_batch
from adjcap.actors.index_task import put_index
from adjcap.engine.cluster_plan import PoolPlan
from adjcap.config import Config
from adjcap.engine.executor import Executor, Stream
from adjcap.jobs.encode_corpus import index_for
from adjcap.jobs.ray_session import check_pools, data_poll


def decode_tasks(cfg: Config) -> int:
    """Image-decoding tasks at once, cluster-wide: ``ray.decode_tasks``, else two per pool actor."""
    return cfg.ray.decode_tasks or 2 * cfg.ray.workers


class RayExecutor(Executor):
    def __init__(self, pools: PoolPlan, corpus: Any, board: Any = None):
        """``pools``: the run plan's (each pool's Ray resources on this cluster); ``corpus``: the run
        plan's (the retrievers' index is found by its fingerprint, the nouns tagged from its texts);
        ``board``: the job's progress board."""
        self.pools, self.corpus, self.board = pools, corpus, board

    def dataset(self, s: Stream):
        """decode -> the pools, as a Ray dataset: of packed states, or, with a sink, of what the last
        pool's actors wrote (:func:`adjcap.engine.batch_sink.done_columns`)."""
        cfg = s.cfg
        ds = ray.data.from_arrow(list(s.blocks()))
        # bounded: unbounded, Ray Data starts one decode process per free decode_cpus of the cluster (23 on
        # two 8-CPU nodes, ~0.8 GiB each), far more than the pools can take images from
        ds = ds.map_batches(decode_batch, fn_kwargs={"board": self.board, "preps": s.preps, "keep_bytes": s.keep_bytes},
                            batch_size=s.decode_size, batch_format="pyarrow", num_cpus=cfg.ray.decode_cpus,
                            compute=TaskPoolStrategy(size=decode_tasks(cfg)))
        plan = check_pools(self.pools, s.first)
        refs: dict[str, Any] = {}
        for p in s.layout:
            kwargs = {"cfg": cfg, "board": self.board, **p.kwargs}
            if s.sink is not None and p.kwargs.get("last"):
                kwargs["sink"] = s.sink
            families = stage_registry.families_of(p.kwargs.get("stages", ()))
            if "index" in families:
                kwargs["given"] = {**kwargs["given"], "index": self._index(cfg, refs)}
            if "captioner" in families and needs_nouns(cfg):
                kwargs["given"] = {**kwargs["given"], "nouns": self._nouns(cfg, refs)}
            ds = ds.map_batches(
                p.actor, fn_constructor_kwargs=kwargs, batch_size=s.sizes[p.pool], batch_format="pyarrow",
                compute=ActorPoolStrategy(size=p.actors), **plan[p.pool], **p.options,
            )
        return ds

    def run(self, stream: Stream) -> Iterator[pa.Table]:
        poll = PollPace(stream.cfg.ray.data_poll_s)
        try:
            for table in self.dataset(stream).iter_batches(batch_format="pyarrow", batch_size=None):
                poll.output()
                yield table
        finally:  # the next job in this process (a reproduce table's next row) starts from its own
            data_poll(poll.base)

    def _index(self, cfg: Config, refs: dict):
        # once per job; each node's retriever actors share one read-only copy (adjcap.index.shared), read
        # and put by a worker (the driver's CPU stays off the index:
        # docs/benchmarks/pipeline.md, "The driver off the image path"); its worker (torch imported)
        # exits after it; lost with its node, Ray runs the task again
        if "index" not in refs:
            refs["index"] = ray.remote(num_cpus=cfg.ray.decode_cpus, max_calls=1)(put_index).remote(
                str(index_for(cfg, self.corpus)), self.corpus.texts)
        return refs["index"]

    def _nouns(self, cfg: Config, refs: dict):
        # stage 3's corpus nouns, tagged once per corpus and kept with the index (adjcap.index.nouns), put
        # once per job: the captioner actors never read the corpus (the run plan read it once)
        if "nouns" not in refs:
            refs["nouns"] = ray.put(corpus_nouns(cfg, self.corpus))
        return refs["nouns"]


class PollPace:
    """Ray Data's scheduler looks at its running tasks every ``ray.data_poll_s`` (:func:`jobs.ray_session.data_poll`),
    and each look costs the driver about the same CPU whatever the images. Where a block takes many times
    that to come back (a CPU-bound job: ~8 s per 128-image block on 2 cores), the scheduler looks up to a
    quarter of the time between the blocks coming back, at most :data:`LONGEST` s: the pools' actors
    meanwhile work on the tasks queued on them. Never shorter than the configured poll (a GPU job, whose
    blocks come back faster, keeps it)."""

    LONGEST = 2.0

    def __init__(self, base: float):
        self.base, self.last, self.gap = base, None, None

    def output(self) -> None:
        """A block came back (the gaps are counted from the first one: the models' loading is not one)."""
        now = time.monotonic()
        if self.last is not None:
            gap = now - self.last
            self.gap = gap if self.gap is None else 0.7 * self.gap + 0.3 * gap
            data_poll(self.seconds())
        self.last = now

    def seconds(self) -> float:
        return self.base if self.gap is None else max(self.base, min(self.LONGEST, self.gap / 4))


def needs_nouns(cfg: Config) -> bool:
    """Stage 3 counts nouns over the corpus captions (IFCap's frequency entity filter)."""
    return cfg.captioner.family == "ifcap" and cfg.captioner.entities.mode == "frequency"


def corpus_nouns(cfg: Config, corpus):
    """The corpus captions' nouns from the index's directory, tagged there first when missing."""
    from adjcap.index.lifecycle import encoder_identity, index_location
    from adjcap.index.nouns import ensure_nouns

    where = index_location(cfg.retrieval, cfg.paths.cache_dir, encoder_identity(cfg.retrieval.encoder),
                           corpus.fingerprint)
    try:
        return ensure_nouns(where, corpus.texts, corpus.fingerprint, cfg.captioner.entities.tagger, say=print)
    except (LookupError, OSError, ValueError) as e:  # the tagger's data missing: stage 3 tags per image
        print(f"entities: the corpus nouns were not tagged ({e}); the captioner tags each image's captions")
        return None

"""Feature extraction, the Ray part of the main job: records -> image decode (CPU tasks) -> the stage
pools (retriever -> verifier -> captioner -> scorer, or one fused pool, as the run plan lays them out:
``RunPlan.pools``, :class:`adjcap.cluster_plan.PoolPlan`) -> Parquet
feature parts in the run directory, written by the last pool's actors (:mod:`adjcap.batch_sink`); the
driver gets back only each image's id, split, error and computed stages (docs/architecture.md, "Data
flow of one image"). Images that need no model (every stage stored, or refused by the reader) never
enter Ray: the driver writes them.

Resume: image ids already written (in complete part files) are skipped; parts are written to a temp
name and renamed, so a crash never leaves a part that looks complete."""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import ray
from ray.data import ActorPoolStrategy, TaskPoolStrategy

from adjcap import stage_registry
from adjcap.actors import transport
from adjcap.actors.decode import decode_batch
from adjcap.actors.index_task import put_index
from adjcap.actors.pool import actor_class
from adjcap.batch_sink import Sink, count_done
from adjcap.cluster_plan import PoolPlan
from adjcap.config import Config
from adjcap.data.records import Record
from adjcap.features import rows_to_table
from adjcap.data.corpora import exposure
from adjcap.rundir import RunDir
from adjcap.run_plan import RunPlan
from adjcap.stage_cache import apply_outputs
from adjcap.image_state import ImageState, decode_state
from adjcap.jobs.driver_threads import ThreadCPU
from adjcap.jobs.encode_corpus import index_for
from adjcap.jobs.failures import FailureWatch
from adjcap.jobs.progress_display import tracked
from adjcap.jobs.ray_session import check_pools, has_gpus


BLOCK_BATCHES = 4  # the most batches in one block (block_rows)


@dataclass(frozen=True)
class PoolRun:
    """One pool of the stream: its actor class, its pool (resources by name), its actors and batch size,
    what its constructor gets beyond ``cfg`` and ``board``, the stage names it reports progress under,
    and the extra map_batches options (its runtime environment, when not the job's)."""

    actor: type
    pool: str
    actors: int
    batch_size: int
    kwargs: dict
    meters: tuple[str, ...]
    options: dict


def pools(plan: PoolPlan, first: int = 0, gpu: bool = False) -> list[PoolRun]:
    """The pools images stream through from stage index ``first`` on, in order, as the run plan lays
    them out (:class:`adjcap.cluster_plan.PoolPlan`: split or fused, a family's isolated environment and
    its part of a later stage included); each pool's output carries only what the pools after it read."""
    layout = plan.layout(gpu, first)
    out = []
    for i, p in enumerate(layout):
        later = [m for q in layout[i + 1:] for m in q.meters]
        out.append(PoolRun(actor_class(p.actor_name), p.name, p.actors, p.batch_size,
                           {"stages": p.stages, "given": dict.fromkeys(p.given), "last": i == len(layout) - 1,
                            "pool": p.name, "part": p.part, "keep": transport.kept_for(plan.cfg, later)},
                           p.meters, {"runtime_env": dict(p.env)} if p.env else {}))
    return out


def write_references(run: RunDir, benchmark: str, records: Mapping[str, Sequence[Record]]) -> None:
    """The references of every image in the run, plus NoCaps domains and COCO ids when present."""
    for split, recs in records.items():
        run.write_references(
            benchmark, split,
            {r.image_id: list(r.references) for r in recs},
            domains={r.image_id: r.domain for r in recs if r.domain},
            coco_ids={r.image_id: r.coco_id for r in recs if r.coco_id is not None},
        )


def extract_features(plan: RunPlan, resume: bool = True, stage_stats: dict | None = None) -> dict:
    """Inside a Ray session: the features of the plan's records in its run directory (its resolved
    config, corpus, stage identities). Returns {split: {images, skipped, done, failed}}.

    With ``cache.share_stages`` every image starts from its deepest stage prefix stored in the stage
    cache (:mod:`adjcap.stage_cache`): an image with every stage stored is written without any
    model, the pools of stages no image needs are not started, and new stage outputs are stored.
    Stops (:class:`adjcap.jobs.failures.TooManyFailures`, what was written kept) once more than
    ``ray.max_failed_share`` of the images back failed. ``stage_stats`` (when given) receives
    {"computed": {stage: images}, "reused": {stage: images}}."""
    cfg, run = plan.cfg, plan.run
    todo: list[Record] = []
    summary: dict[str, dict[str, int]] = {}
    for split, recs in plan.records.items():
        if not resume:
            run.clear_features(cfg.benchmark, split)
        have = run.done_ids(cfg.benchmark, split)
        new = [r for r in recs if r.image_id not in have]
        summary[split] = {"images": len(recs), "skipped": len(recs) - len(new), "done": 0, "failed": 0}
        todo.extend(new)
    names = stage_registry.names()
    computed = {s: 0 for s in names}
    reused = {s: 0 for s in names}
    if stage_stats is not None:
        stage_stats.update(computed=computed, reused=reused, shared=cfg.cache.share_stages)
    if not todo:
        return summary

    check_pools(plan.pools)  # an impossible --workers / memory request is refused before any model loads
    cache = plan.stage_cache()
    found = cache.lookup(r.image_id for r in todo if not r.error) if cache else {}
    for outs in found.values():
        for stage in outs:
            reused[stage] += 1
    buffers: dict[str, list[dict]] = defaultdict(list)
    watch = FailureWatch(len(todo), cfg.ray.max_failed_share)

    def flush(split: str) -> None:
        rows = buffers.pop(split, [])
        if rows:
            run.write_part(cfg.benchmark, split, rows_to_table(rows))

    def emit(state: ImageState) -> None:
        buffers[state.split].append(state.to_row())
        summary[state.split]["done" if state.error is None else "failed"] += 1
        for stage in state.computed:
            computed[stage] += 1
        if cache is not None:
            cache.add([state])
        if len(buffers[state.split]) >= cfg.ray.rows_per_part:
            flush(state.split)
        watch.add([state.image_id], [state.error])

    try:
        _extract(plan, todo, found, cache, emit, watch, summary, computed)
        watch.check()  # every image back
    finally:  # what was computed is kept, also when the job stops
        for split in list(buffers):
            flush(split)
        if cache is not None:
            cache.flush()
    return summary


def _extract(plan: RunPlan, todo: list[Record], found: dict, cache, emit, watch: FailureWatch, summary: dict,
             computed: dict) -> None:
    """The driver's half of :func:`extract_features`: ``emit`` the images that need no model, stream the
    others through the pools and count what comes back."""
    cfg, run, corpus = plan.cfg, plan.run, plan.corpus
    names = stage_registry.names()
    rest = []
    for r in todo:  # images that need no model: every stage stored, or refused by the reader
        if r.error:
            emit(decode_state(r.image_id, cfg.benchmark, r.split, r.domain, None, r.error))
        elif len(found.get(r.image_id, ())) == len(names):
            emit(apply_outputs(ImageState(r.image_id, cfg.benchmark, r.split, r.domain or None), found[r.image_id]))
        else:
            rest.append(r)
    if rest:
        first = min(len(found.get(r.image_id, ())) for r in rest)  # the first stage some image needs
        gpu = has_gpus()
        print("pools: " + ", ".join(f"{p.pool} x{p.actors} ({' + '.join(p.meters)})"
                                    for p in pools(plan.pools, first, gpu)))
        sink = Sink.for_run(run, cfg.benchmark, cache)
        with tracked(cfg.ray, "features", stream_stages(plan.pools, first, gpu), len(rest)) as board:
            ds = _stream(plan.pools, corpus, rest, found, first, gpu, board, sink)
            # the workers wrote the parts and the stage cache; the driver only counts, with Arrow
            for table in ds.iter_batches(batch_format="pyarrow", batch_size=None):
                count_done(table, summary, computed)
                watch.add_table(table)


def stream_stages(plan: PoolPlan, first: int, gpu: bool = False) -> list[str]:
    """The stages images stream through from stage index ``first`` on, in order, as the actors name
    them when they report progress (decode, then each pool's stages)."""
    out = ["decode"]
    for p in plan.layout(gpu, first):
        out.extend(m for m in p.meters if m not in out)
    return out


def decode_tasks(cfg: Config) -> int:
    """Image-decoding tasks at once, cluster-wide: ``ray.decode_tasks``, else two per pool actor."""
    return cfg.ray.decode_tasks or 2 * cfg.ray.workers


def block_rows(images: int, batch_size: int, slots: int) -> int:
    """Rows per Ray Data block: a multiple of ``batch_size`` (the least common multiple of the pools'
    batch sizes: every batch full but the job's last), up to ``BLOCK_BATCHES`` of them, so the job's
    blocks number at least twice the tasks that can run at once (``slots``: decode tasks or pool actors).
    Fewer, larger blocks cost the driver's executor less per image (docs/benchmarks/pipeline.md, "The driver
    off the image path")."""
    k = max(1, min(BLOCK_BATCHES, images // (batch_size * 2 * max(slots, 1))))
    return k * batch_size


def _stream(pool_plan: PoolPlan, corpus, todo: list[Record], found: dict, first: int, gpu: bool, board=None,
            sink: Sink | None = None):
    """decode -> the pools from stage index ``first`` on (the run plan's ``pool_plan``), as a Ray dataset:
    of packed states, or, with ``sink``, of what the last pool's actors wrote
    (:func:`adjcap.batch_sink.done_columns`)."""
    cfg = pool_plan.cfg
    layout = pools(pool_plan, first, gpu)
    bs = pool_plan.decode_batch(gpu)  # the decode tasks'
    n = len(todo)
    table = transport.records(
        {"image_id": [r.image_id for r in todo], "benchmark": [cfg.benchmark] * n,
         "split": [r.split for r in todo], "domain": [r.domain or None for r in todo],
         "error": [r.error or None for r in todo], "image_path": [r.image_path for r in todo],
         "exif": [cfg.benchmark_cfg().applies_exif()] * n},
        [found.get(r.image_id) for r in todo] if found else None)
    rows = block_rows(n, math.lcm(bs, *(p.batch_size for p in layout)),
                      max(decode_tasks(cfg), sum(p.actors for p in layout)))
    ds = ray.data.from_arrow([table.slice(i, rows) for i in range(0, n, rows)])
    # bounded: unbounded, Ray Data starts one decode process per free decode_cpus of the cluster (23 on
    # two 8-CPU nodes, ~0.8 GiB each), far more than the pools can take images from
    preps, keep_bytes = decode_pixels(cfg, layout)
    ds = ds.map_batches(decode_batch, fn_kwargs={"board": board, "preps": preps, "keep_bytes": keep_bytes},
                        batch_size=bs, batch_format="pyarrow", num_cpus=cfg.ray.decode_cpus,
                        compute=TaskPoolStrategy(size=decode_tasks(cfg)))
    plan = check_pools(pool_plan, first)
    index_ref = nouns_ref = None
    for p in layout:
        kwargs = {"cfg": cfg, "board": board, **p.kwargs}
        if sink is not None and p.kwargs.get("last"):
            kwargs["sink"] = sink
        if "index" in stage_registry.families_of(p.kwargs.get("stages", ())):
            # once per job; each node's retriever actors share one read-only copy (adjcap.index.shared)
            if index_ref is None:
                # read and put by a worker (the driver's CPU stays off the index: docs/benchmarks/pipeline.md,
                # "The driver off the image path"); its worker (torch imported) exits after it; lost with its
                # node, Ray runs the task again
                index_ref = ray.remote(num_cpus=cfg.ray.decode_cpus, max_calls=1)(put_index).remote(
                    str(index_for(cfg, corpus)), corpus.texts)
            kwargs["given"] = {**kwargs["given"], "index": index_ref}
        if "captioner" in stage_registry.families_of(p.kwargs.get("stages", ())) and needs_nouns(cfg):
            # stage 3's corpus nouns, tagged once per corpus and kept with the index (adjcap.index.nouns),
            # put once per job: the captioner actors never read the corpus (the run plan read it once)
            if nouns_ref is None:
                nouns_ref = ray.put(corpus_nouns(cfg, corpus))
            kwargs["given"] = {**kwargs["given"], "nouns": nouns_ref}
        ds = ds.map_batches(
            p.actor, fn_constructor_kwargs=kwargs, batch_size=p.batch_size, batch_format="pyarrow",
            compute=ActorPoolStrategy(size=p.actors), **plan[p.pool], **p.options,
        )
    return ds


def decode_pixels(cfg: Config, layout: Sequence[PoolRun]) -> tuple[tuple, bool]:
    """(the pixel geometries the decode tasks prepare for the pools' models, whether the image's bytes
    travel too): bytes only where some pool's model preprocesses otherwise (a transformers captioner's
    own processor, the ``lavis`` backend's environment) or ``ray.prepare_pixels`` is off
    (docs/architecture.md, "Pixels prepared once")."""
    if not cfg.ray.prepare_pixels:
        return (), True
    stages = [s for p in layout for s in p.kwargs["stages"]]
    preps, known = stage_registry.pixel_preps(cfg, stages)
    return preps, not known


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


def corpus_exposure(plan: RunPlan) -> dict:
    """The corpus retrieval searched (the plan's, read once), its size and its overlap with each split's
    references (:func:`adjcap.data.corpora.exposure`; ``reproduce corpus-swap`` shows them)."""
    cfg = plan.cfg
    name = cfg.retrieval.corpus or f"{cfg.benchmark} (its own)"
    return exposure(plan.corpus, name, {split: {r.image_id: list(r.references) for r in recs}
                                        for split, recs in plan.records.items()})


def main(plan: RunPlan, resume: bool = True) -> dict:
    """Inside a Ray session: extract what is missing, write and print the summary."""
    t0, cpu0, main0 = time.time(), time.process_time(), time.thread_time()
    stage_stats: dict = {}
    cfg, run = plan.cfg, plan.run
    with ThreadCPU() as threads:
        summary = extract_features(plan, resume=resume, stage_stats=stage_stats)
    dt = time.time() - t0
    # the driver process's own CPU (every thread: Ray Data's executor too) while it extracted features
    # (and of its main thread alone: what it does per image itself, without Ray's threads; and by thread)
    run.write_summary({"splits": summary, "seconds": dt, "driver_cpu_s": time.process_time() - cpu0,
                       "driver_main_thread_cpu_s": time.thread_time() - main0,
                       "driver_cpu_s_by_thread": threads.by_name(), "stages": stage_stats,
                       "corpus": corpus_exposure(plan)})
    for split, s in summary.items():
        print(f"features {cfg.benchmark}-{split}: {s['images']} images, {s['done']} done, "
              f"{s['failed']} failed, {s['skipped']} already written")
    n_new = sum(s["done"] + s["failed"] for s in summary.values())
    if stage_stats.get("shared") and n_new:
        print("stages: images computed " + ", ".join(f"{k} {v}" for k, v in stage_stats["computed"].items())
              + "; reused from the stage cache " + ", ".join(f"{k} {v}" for k, v in stage_stats["reused"].items()))
    if n_new:
        print(f"throughput: {n_new / dt:.2f} images/s over {dt:.1f}s (incl. model loading)")
    return summary

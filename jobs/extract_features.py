"""Feature extraction, the Ray part of the main job: records -> image decode (CPU tasks) -> the stage
pools (retriever -> verifier -> captioner -> scorer, or one fused pool, as the run plan lays them out:
``RunPlan.pools``, :class:`adjcap.engine.cluster_plan.PoolPlan`) -> Parquet
feature parts in the run directory, written by the last pool's actors (:mod:`adjcap.engine.batch_sink`); the
driver gets back only each image's id, split, error and computed stages (docs/architecture.md, "Data
flow of one image"). Images that need no model (every stage stored, or refused by the reader) never
enter Ray: the driver writes them. With ``executor = local`` the same stream runs in the driver's
process (:mod:`adjcap.jobs.executors`).

Resume: image ids already written (in complete part files) are skipped; parts are written to a temp
name and renamed, so a crash never leaves a part that looks complete."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Mapping, Sequence

from adjcap.engine import stage_registry
from adjcap.engine import executor as engine
from adjcap.engine import transport
from adjcap.engine.executor import Executor, PoolRun
from adjcap.actors.pool import actor_class
from adjcap.engine.batch_sink import Sink, count_done
from adjcap.engine.cluster_plan import PoolPlan
from adjcap.data.records import Record
from adjcap.engine.features import rows_to_table
from adjcap.data.corpora import exposure
from adjcap.storage.rundir import RunDir
from adjcap.engine.run_plan import RunPlan
from adjcap.engine.stage_cache import apply_outputs
from adjcap.engine.image_state import ImageState, decode_state
from adjcap.jobs.driver_threads import ThreadCPU
from adjcap.jobs.failures import FailureWatch
from adjcap.jobs.progress_display import tracked
from adjcap.jobs import executors
from adjcap.jobs.ray_backend import decode_tasks


def pools(plan: PoolPlan, first: int = 0, gpu: bool = False) -> list[PoolRun]:
    """The pools images stream through from stage index ``first`` on, in order, as the run plan lays
    them out (:class:`adjcap.engine.cluster_plan.PoolPlan`: split or fused, a family's isolated environment and
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


def extract_features(plan: RunPlan, resume: bool = True, stage_stats: dict | None = None,
                     executor: Executor | None = None) -> dict:
    """Inside the job's session (:func:`adjcap.jobs.executors.job_session`): the features of the plan's
    records in its run directory (its resolved config, corpus, stage identities). Returns {split: {images,
    skipped, done, failed}}.

    With ``cache.share_stages`` every image starts from its deepest stage prefix stored in the stage
    cache (:mod:`adjcap.engine.stage_cache`): an image with every stage stored is written without any
    model, the pools of stages no image needs are not started, and new stage outputs are stored.
    Stops (:class:`adjcap.jobs.failures.TooManyFailures`, what was written kept) once more than
    ``ray.max_failed_share`` of the images back failed. ``stage_stats`` (when given) receives
    {"computed": {stage: images}, "reused": {stage: images}} and, once two batches came back from the pools,
    "streaming": {"images", "seconds"} (:class:`StreamClock`). ``executor``: the backend that runs the
    stream (:mod:`adjcap.engine.executor`; default the config's ``executor``: :func:`adjcap.jobs.executors.executor_for`)."""
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

    executors.check_pools(plan)  # an impossible --workers / memory request is refused before any model loads
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
        _extract(plan, todo, found, cache, emit, watch, summary, computed, executor, stage_stats)
        watch.check()  # every image back
    finally:  # what was computed is kept, also when the job stops
        for split in list(buffers):
            flush(split)
        if cache is not None:
            cache.flush()
    return summary


def _extract(plan: RunPlan, todo: list[Record], found: dict, cache, emit, watch: FailureWatch, summary: dict,
             computed: dict, executor: Executor | None = None, stage_stats: dict | None = None) -> None:
    """The driver's half of :func:`extract_features`: ``emit`` the images that need no model, stream the
    others through the pools and count what comes back."""
    cfg, run = plan.cfg, plan.run
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
        gpu = executors.gpu_present(cfg)
        layout = pools(plan.pools, first, gpu)
        print("pools: " + ", ".join(f"{p.pool} x{p.actors} ({' + '.join(p.meters)})" for p in layout))
        slots = max(decode_tasks(cfg), sum(p.actors for p in layout))
        s = engine.stream(cfg, rest, found, layout, gpu, first, Sink.for_run(run, cfg.benchmark, cache), slots,
                          decode_size=plan.pools.decode_batch(gpu))
        with tracked(cfg.ray, "features", stream_stages(plan.pools, first, gpu, layout), len(rest),
                     local=not executors.on_ray(cfg)) as board:
            # the workers wrote the parts and the stage cache; the driver only counts, with Arrow
            clock = StreamClock()
            for table in (executor or executors.executor_for(plan, board)).run(s):
                count_done(table, summary, computed)
                watch.add_table(table)
                clock.add(table.num_rows)
                if stage_stats is not None and (pace := clock.figures()):
                    stage_stats["streaming"] = pace


class StreamClock:
    """The pools' pace once streaming: the images of every batch back after the first, over the time from
    the first batch back to the last. Model loading, the index and the pipeline's filling are before the
    first batch, so this is the rate a longer job approaches (the job's overall rate counts them)."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.last = 0.0
        self.images = 0

    def add(self, n: int) -> None:
        now = time.perf_counter()
        if self.first is None:
            self.first = now
        else:
            self.images += n
        self.last = now

    def figures(self) -> dict | None:
        """{"images", "seconds"} once a batch came back after the first, else None."""
        if not self.images or self.last <= (self.first or 0.0):
            return None
        return {"images": self.images, "seconds": round(self.last - self.first, 3)}


def stream_stages(plan: PoolPlan, first: int, gpu: bool = False, layout: Sequence[PoolRun] | None = None
                  ) -> list[str]:
    """The stages images stream through from stage index ``first`` on (the pools ``layout``, default
    the plan's), in order, as the actors name them when they report progress (decode, then each pool's
    stages)."""
    out = ["decode"]
    for p in layout if layout is not None else plan.layout(gpu, first):
        out.extend(m for m in p.meters if m not in out)
    return out


def corpus_exposure(plan: RunPlan) -> dict:
    """The corpus retrieval searched (the plan's, read once), its size and its overlap with each split's
    references (:func:`adjcap.data.corpora.exposure`; ``reproduce corpus-swap`` shows them)."""
    cfg = plan.cfg
    name = cfg.retrieval.corpus or f"{cfg.benchmark} (its own)"
    return exposure(plan.corpus, name, {split: {r.image_id: list(r.references) for r in recs}
                                        for split, recs in plan.records.items()})


def main(plan: RunPlan, resume: bool = True) -> dict:
    """Inside the job's session: extract what is missing, write and print the summary."""
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
        stream = stage_stats.get("streaming")
        print(f"throughput: {n_new / dt:.2f} images/s over {dt:.1f}s (incl. model loading)"
              + (f"; streaming: {stream['images'] / stream['seconds']:.2f} images/s ({stream['images']} images "
                 f"after the first batch, in {stream['seconds']:.1f}s)" if stream else ""))
    return summary

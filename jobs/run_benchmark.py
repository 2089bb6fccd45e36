"""Feature extraction, the Ray part of the main job: records -> image decode (CPU tasks) ->
retriever -> verifier -> captioner -> scorer pools -> Parquet feature parts in the run directory.

Resume: image ids already written (in complete part files) are skipped; parts are written to a temp
name and renamed, so a crash never leaves a part that looks complete."""

from __future__ import annotations

import pickle
import time
from collections import defaultdict

import ray
from ray.data import ActorPoolStrategy

from actors.captioner import CaptionerActor
from actors.decode import decode_batch
from actors.lavis import LavisScorerActor, LavisVerifierActor
from actors.retriever import RetrieverActor
from actors.scorer import ScorerActor
from actors.verifier import VerifierActor
from adjcap.config import Config
from adjcap.data.benchmarks import read_benchmark, split_annotations
from adjcap.data.records import Record
from adjcap.features import rows_to_table
from adjcap.index import benchmark_corpus, index_arrays
from adjcap.lavis_env import runtime_env as lavis_runtime_env
from adjcap.rundir import RunDir
from jobs.encode_corpus import index_for
from jobs.ray_session import check_pools, pool_resources

def pools(cfg: Config) -> list[tuple[type, str, dict]]:
    """(actor class, pool name, extra map_batches options) in stage order. With the LAVIS verifier
    backend, stage 2 and the verifier half of stage 4 run in LAVIS's own environment."""
    if not (cfg.verifier.enabled and cfg.verifier.backend == "lavis"):
        return [(RetrieverActor, "retriever", {}), (VerifierActor, "verifier", {}),
                (CaptionerActor, "captioner", {}), (ScorerActor, "scorer", {})]
    env = {"runtime_env": lavis_runtime_env(cfg.paths.cache_dir)}
    return [(RetrieverActor, "retriever", {}), (LavisVerifierActor, "verifier", env),
            (CaptionerActor, "captioner", {}), (LavisScorerActor, "scorer", env), (ScorerActor, "scorer", {})]


def read_records(cfg: Config) -> dict[str, list[Record]]:
    """Every configured split's records."""
    b = cfg.resolved().benchmark_cfg(cfg.benchmark)
    out = {}
    for split in cfg.splits:
        ann = split_annotations(b, split, cfg.benchmark)
        out[split] = read_benchmark(b.format, ann, b.images, split, limit=cfg.limit)
    return out


def write_references(run: RunDir, benchmark: str, records: dict[str, list[Record]]) -> None:
    """The references of every image in the run, plus NoCaps domains and COCO ids when present."""
    for split, recs in records.items():
        run.write_references(
            benchmark, split,
            {r.image_id: list(r.references) for r in recs},
            domains={r.image_id: r.domain for r in recs if r.domain},
            coco_ids={r.image_id: r.coco_id for r in recs if r.coco_id is not None},
        )


def extract_features(cfg: Config, run: RunDir, records: dict[str, list[Record]], resume: bool = True) -> dict:
    """Inside a Ray session (``cfg`` resolved). Returns {split: {images, skipped, done, failed}}."""
    todo: list[Record] = []
    summary: dict[str, dict[str, int]] = {}
    for split, recs in records.items():
        if not resume:
            run.clear_features(cfg.benchmark, split)
        have = run.done_ids(cfg.benchmark, split)
        new = [r for r in recs if r.image_id not in have]
        summary[split] = {"images": len(recs), "skipped": len(recs) - len(new), "done": 0, "failed": 0}
        todo.extend(new)
    if not todo:
        return summary

    check_pools(cfg)  # an impossible --workers / memory request is refused before any model loads
    corpus = benchmark_corpus(cfg.benchmark_cfg(), cfg.benchmark)
    vectors, ids, precision = index_arrays(index_for(cfg, corpus))
    index_ref = ray.put((vectors, ids, precision, corpus.texts))
    bs = cfg.ray.batch_size
    exif = cfg.benchmark_cfg().applies_exif()
    items = [
        {"image_id": r.image_id, "image_path": r.image_path or "", "error": r.error or "", "split": r.split,
         "domain": r.domain or "", "benchmark": cfg.benchmark, "exif": exif}
        for r in todo
    ]
    ds = ray.data.from_items(items, override_num_blocks=max(1, min(len(items) // bs, 200)))
    ds = ds.map_batches(decode_batch, batch_size=bs, batch_format="numpy", num_cpus=cfg.ray.decode_cpus)
    for actor, pool, env in pools(cfg):
        kwargs = {"cfg": cfg, "index_ref": index_ref} if pool == "retriever" else {"cfg": cfg}
        ds = ds.map_batches(
            actor, fn_constructor_kwargs=kwargs, batch_size=bs, batch_format="numpy",
            compute=ActorPoolStrategy(size=cfg.ray.workers), **pool_resources(cfg, pool), **env,
        )

    buffers: dict[str, list[dict]] = defaultdict(list)

    def flush(split: str) -> None:
        rows = buffers.pop(split, [])
        if rows:
            run.write_part(cfg.benchmark, split, rows_to_table(rows))

    for batch in ds.iter_batches(batch_format="numpy", batch_size=None):
        for blob in batch["state"]:
            state = pickle.loads(blob)
            buffers[state.split].append(state.to_row())
            summary[state.split]["done" if state.error is None else "failed"] += 1
            if len(buffers[state.split]) >= cfg.ray.rows_per_part:
                flush(state.split)
    for split in list(buffers):
        flush(split)
    return summary


def main(cfg: Config, run: RunDir, records: dict[str, list[Record]], resume: bool = True) -> dict:
    """Inside a Ray session: extract what is missing, write and print the summary."""
    t0 = time.time()
    summary = extract_features(cfg, run, records, resume=resume)
    dt = time.time() - t0
    run.write_summary({"splits": summary, "seconds": dt})
    for split, s in summary.items():
        print(f"features {cfg.benchmark}-{split}: {s['images']} images, {s['done']} done, "
              f"{s['failed']} failed, {s['skipped']} already written")
    n_new = sum(s["done"] + s["failed"] for s in summary.values())
    if n_new:
        print(f"throughput: {n_new / dt:.2f} images/s over {dt:.1f}s (incl. model loading)")
    return summary

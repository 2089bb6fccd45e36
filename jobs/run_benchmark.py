"""The main job: records -> image decode (CPU tasks) -> retriever -> verifier -> captioner -> scorer
pools -> Parquet feature parts in the run directory; then fit, predict, evaluate and report.

Resume: image ids already written (in complete part files) are skipped; parts are written to a temp
name and renamed, so a crash never leaves a part that looks complete."""

from __future__ import annotations

import json
import pickle
import time
from collections import defaultdict
from pathlib import Path

import pyarrow.parquet as pq
import ray
from ray.data import ActorPoolStrategy

from actors.captioner import CaptionerActor
from actors.decode import decode_batch
from actors.lavis import LavisScorerActor, LavisVerifierActor
from actors.retriever import RetrieverActor
from actors.scorer import ScorerActor
from actors.verifier import VerifierActor
from adjcap.config import Config
from adjcap.data.benchmarks import read_benchmark
from adjcap.data.records import Record
from adjcap.features import rows_to_table
from adjcap.io import atomic_write_json, atomic_write_parquet, atomic_write_text, is_temp_name
from adjcap.lavis_env import runtime_env as lavis_runtime_env
from adjcap.pipeline import index_arrays, load_benchmark_corpus
from jobs.encode_corpus import _getter, ensure_index
from jobs.ray_session import pool_resources, ray_session


# --------------------------------------------------------------------------------------------
# run directory
# --------------------------------------------------------------------------------------------


def default_run_dir(cfg: Config) -> Path:
    return Path(cfg.paths.runs_dir) / f"{cfg.name}-{cfg.benchmark}"


def features_dir(run_dir: Path, benchmark: str, split: str) -> Path:
    return run_dir / "features" / f"{benchmark}-{split}"


def done_ids(run_dir: Path, benchmark: str, split: str) -> set[str]:
    d = features_dir(run_dir, benchmark, split)
    out: set[str] = set()
    for p in sorted(d.glob("part-*.parquet")):
        if is_temp_name(p.name):
            continue
        out.update(pq.read_table(p, columns=["image_id"]).column("image_id").to_pylist())
    return out


def _next_part(d: Path) -> Path:
    nums = [int(p.stem.split("-")[1]) for p in d.glob("part-*.parquet") if p.stem.split("-")[1].isdigit()]
    return d / f"part-{(max(nums) + 1) if nums else 0:05d}.parquet"


def read_records(cfg: Config) -> dict[str, list[Record]]:
    b = cfg.benchmark_cfg()
    out = {}
    for split in cfg.splits:
        ann = b.annotations_by_split.get(split, b.annotations)
        out[split] = read_benchmark(b.format, cfg.path(ann), cfg.path(b.images), split, limit=cfg.limit)
    return out


def write_references(run_dir: Path, cfg: Config, records: dict[str, list[Record]]) -> None:
    """The references of every image in the run, IFCap layout ({id: [captions]}), plus domains."""
    for split, recs in records.items():
        atomic_write_json(run_dir / "references" / f"{cfg.benchmark}-{split}.json",
                          {r.image_id: list(r.references) for r in recs})
        if any(r.domain for r in recs):
            atomic_write_json(run_dir / "references" / f"{cfg.benchmark}-{split}.domains.json",
                              {r.image_id: r.domain for r in recs})
        ids = {r.image_id: r.coco_id for r in recs if r.coco_id is not None}
        if ids:
            atomic_write_json(run_dir / "references" / f"{cfg.benchmark}-{split}.coco_ids.json", ids)


# --------------------------------------------------------------------------------------------
# the streaming feature job
# --------------------------------------------------------------------------------------------


def extract_features(cfg: Config, run_dir: Path, records: dict[str, list[Record]], resume: bool = True) -> dict:
    """Inside a Ray session. Returns a summary {split: {done, failed, skipped}}."""
    todo: list[Record] = []
    summary: dict[str, dict[str, int]] = {}
    for split, recs in records.items():
        have = done_ids(run_dir, cfg.benchmark, split) if resume else set()
        if not resume:
            for p in features_dir(run_dir, cfg.benchmark, split).glob("part-*.parquet"):
                p.unlink()
        new = [r for r in recs if r.image_id not in have]
        summary[split] = {"images": len(recs), "skipped": len(recs) - len(new), "done": 0, "failed": 0}
        todo.extend(new)
    if not todo:
        return summary

    corpus = load_benchmark_corpus(cfg)
    index_path = ensure_index(cfg, corpus)
    vectors, ids, precision = index_arrays(index_path)
    shared_index = _getter(ray.put((vectors, ids, precision, corpus.texts)))
    cfg_dict = cfg.model_dump(mode="json")
    bs = cfg.ray.batch_size
    w = cfg.ray.workers

    items = [
        {"image_id": r.image_id, "image_path": r.image_path or "", "split": r.split,
         "domain": r.domain or "", "benchmark": cfg.benchmark}
        for r in todo
    ]
    ds = ray.data.from_items(items, override_num_blocks=max(1, min(len(items) // bs, 200)))
    ds = ds.map_batches(decode_batch, batch_size=bs, batch_format="numpy", num_cpus=cfg.ray.decode_cpus)
    lavis = cfg.verifier.enabled and cfg.verifier.backend == "lavis"  # LAVIS pools run in their own env
    lavis_env = {"runtime_env": lavis_runtime_env(cfg.cache_dir)} if lavis else {}
    for actor, kwargs, pool, env in (
        (RetrieverActor, {"cfg": cfg_dict, "shared_index": shared_index}, "retriever", {}),
        (LavisVerifierActor if lavis else VerifierActor, {"cfg": cfg_dict}, "verifier", lavis_env),
        (CaptionerActor, {"cfg": cfg_dict}, "captioner", {}),
        *([(LavisScorerActor, {"cfg": cfg_dict}, "scorer", lavis_env)] if lavis else []),
        (ScorerActor, {"cfg": cfg_dict}, "scorer", {}),
    ):
        ds = ds.map_batches(
            actor, fn_constructor_kwargs=kwargs, batch_size=bs, batch_format="numpy",
            compute=ActorPoolStrategy(size=w), **pool_resources(cfg, pool), **env,
        )

    buffers: dict[str, list[dict]] = defaultdict(list)

    def flush(split: str) -> None:
        rows = buffers.pop(split, [])
        if rows:
            d = features_dir(run_dir, cfg.benchmark, split)
            d.mkdir(parents=True, exist_ok=True)
            atomic_write_parquet(_next_part(d), rows_to_table(rows))

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


def read_features(run_dir: Path, benchmark: str, split: str):
    d = features_dir(run_dir, benchmark, split)
    parts = sorted(p for p in d.glob("part-*.parquet") if not is_temp_name(p.name))
    if not parts:
        raise FileNotFoundError(f"no feature parts in {d}; run `adjcap run-job {benchmark}` first")
    import pyarrow as pa

    return pa.concat_tables([pq.read_table(p) for p in parts])


def main(cfg: Config, run_dir: Path | None = None, resume: bool = True, evaluate: bool = True) -> Path:
    run_dir = Path(run_dir or default_run_dir(cfg))
    if cfg.benchmark == "demo":  # the built-in world is generated, never downloaded
        from jobs.demo import prepare

        prepare(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(run_dir / "config.toml", cfg.to_toml())
    records = read_records(cfg)
    write_references(run_dir, cfg, records)
    t0 = time.time()
    with ray_session(cfg):
        summary = extract_features(cfg, run_dir, records, resume=resume)
    dt = time.time() - t0
    n_new = sum(s["done"] + s["failed"] for s in summary.values())
    atomic_write_json(run_dir / "features" / "summary.json", {"splits": summary, "seconds": dt})
    for split, s in summary.items():
        print(f"features {cfg.benchmark}-{split}: {s['images']} images, {s['done']} done, "
              f"{s['failed']} failed, {s['skipped']} already written")
    if n_new:
        print(f"throughput: {n_new / dt:.2f} images/s over {dt:.1f}s (incl. Ray start and model loading)")
    if evaluate:
        from jobs import evaluate as ev
        from jobs import fit

        fit.main(cfg, run_dir)
        if any(r.references for recs in records.values() for r in recs):
            ev.evaluate_run_dir(cfg, run_dir)
            ev.report([run_dir], None)
        else:  # the user's own images: captions, but nothing to score them against
            print(f"no reference captions for {cfg.benchmark}: predictions written, metrics and report skipped")
    print(f"outputs: features/, predictions/, metrics/, report.md, report.html in")
    print(run_dir)
    return run_dir


def load_summary(run_dir: Path) -> dict:
    p = run_dir / "features" / "summary.json"
    return json.loads(p.read_text()) if p.exists() else {}

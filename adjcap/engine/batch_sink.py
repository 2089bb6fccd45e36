"""Where a pool's last actor puts a finished batch (docs/architecture.md, "Data flow of one image"): its
feature rows as one part per split of the run directory, and the outputs of the stages it computed in
the stage cache, both written atomically under names decided by the batch's content
(:func:`adjcap.storage.parts.content_part_name`), so a batch Ray computes again (a retried task, a restarted
actor) replaces its own parts instead of adding its images twice. What goes back to the driver is a
few small columns per image (:func:`done_columns`), never the state."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import pyarrow as pa
import pyarrow.compute as pc

from adjcap.engine.features import rows_to_table
from adjcap.engine.image_state import ImageState
from adjcap.storage.parts import content_part_name
from adjcap.storage.rundir import RunDir
from adjcap.engine.stage_cache import StageCache


@dataclass(frozen=True)
class Sink:
    """What the workers need to write a batch, built once by the driver and handed to the last pool's
    actors through their constructor: the run directory, the benchmark, ``key`` (the run's feature
    identity: part names depend on it) and, with ``cache.share_stages``, the stage cache's root and
    identities (and the settings they hash, for its ``identity.json``)."""

    run_path: str
    benchmark: str
    key: str
    cache_root: str | None = None
    identities: Mapping[str, str] = field(default_factory=dict)
    settings: Mapping[str, Mapping[str, Any]] | None = None

    @classmethod
    def for_run(cls, run: RunDir, benchmark: str, cache: StageCache | None) -> "Sink":
        key = run.identity_path.read_text() if run.identity_path.exists() else ""
        if cache is None:
            return cls(str(run.path), benchmark, key)
        return cls(str(run.path), benchmark, key, str(cache.root), dict(cache.identities),
                   None if cache.settings is None else {k: dict(v) for k, v in cache.settings.items()})

    def cache(self) -> StageCache | None:
        return None if self.cache_root is None else StageCache(Path(self.cache_root), self.identities, self.settings)


def write_batch(states: list[ImageState], sink: Sink, cache: StageCache | None = None) -> None:
    """The batch's feature parts (one per split) and its stage-cache entries (``cache``: the sink's,
    made once per actor), each part named for its images and the run."""
    by_split: dict[str, list[ImageState]] = defaultdict(list)
    for s in states:
        by_split[s.split].append(s)
    run = RunDir(sink.run_path)
    for split, group in by_split.items():
        name = content_part_name(f"{sink.key}\0{sink.benchmark}-{split}", (s.image_id for s in group))
        run.write_part(sink.benchmark, split, rows_to_table([s.to_row() for s in group]), name)
    if cache is not None:
        cache.write_batch(states)


def done_columns(states: list[ImageState]) -> dict[str, list]:
    """What the driver learns of a written batch, per image: its id and split, whether it failed (and
    why: the job's failure share, adjcap.jobs.failures) and the stages computed here, for the summary and stage stats (counted with Arrow, no per-image Python
    on the driver: :func:`count_done`)."""
    return {
        "image_id": [s.image_id for s in states],
        "split": [s.split for s in states],
        "failed": [s.error is not None for s in states],
        "error": [s.error for s in states],
        "computed": [sorted(s.computed) for s in states],
    }


def count_done(table: pa.Table, summary: dict[str, dict[str, int]], computed: dict[str, int]) -> None:
    """Add a table of :func:`done_columns` to ``summary`` ({split: {"done", "failed"}}) and ``computed``
    ({stage: images})."""
    by = table.group_by(["split", "failed"]).aggregate([("image_id", "count")])
    for split, failed, n in zip(*(by.column(c).to_pylist() for c in ("split", "failed", "image_id_count"))):
        summary[split]["failed" if failed else "done"] += n
    stages = pc.value_counts(pc.list_flatten(table.column("computed")))
    for v in stages.to_pylist():
        computed[v["values"]] = computed.get(v["values"], 0) + v["counts"]

"""Per-stage outputs shared between runs, content-addressed in the cache.

A stage's output for an image (its columns: the stage's ``output`` in :mod:`adjcap.engine.stage_registry`) is
decided by the stage's own settings and its inputs' identity, for the four stages:

    retrieve : benchmark images, retrieval encoder (a local checkpoint by content), corpus fingerprint, L
    verify   : retrieve identity + the verifier section (a local model by content), k
    caption  : verify identity + the captioner section (checkpoint, CLIP, tokenizer, K, beam, decoding, entities)
    score    : caption identity + the scorer section

Each identity is a hash over its parent's identity and the settings and inputs the stage reads
(:mod:`adjcap.engine.identity`: speed-only settings never count, paths count by content, retrieval counts the
searched corpus and index by content). Outputs live in

    {cache}/stages/<stage>/<identity>/part-*.parquet    image_id + that stage's output columns (cache.stages_dir)
    {cache}/stages/<stage>/<identity>/identity.json     the settings the identity hashes (for people)

written atomically like feature parts (a part is complete or absent; an unreadable part is set aside).
Before extraction every image gets the outputs of its deepest cached stage prefix (:meth:`StageCache.prefill`);
the stage functions skip a stage an image already has (``ImageState.done``) and mark the stages they
computed (``ImageState.computed``), which :meth:`StageCache.store` then writes back (in a Ray job the last
pool's actors, batch by batch: :meth:`StageCache.write_batch`). Rows that differ
only after extraction (picker, protocol, alpha/beta) have identical identities at every stage.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Iterable, Mapping

import pyarrow as pa

from adjcap.config import Config
from adjcap.engine.identity import content_id, stage_identities, stage_settings  # noqa: F401 - identities live there
from adjcap.engine import stage_registry
from adjcap.storage.io import atomic_write_json
from adjcap.engine.image_state import ImageState
from adjcap.storage.parts import content_part_name, part_paths, read_part, write_part


def apply_outputs(state: ImageState, outputs: Mapping[str, dict[str, Any]]) -> ImageState:
    """Fill a state with stored stage outputs (a consecutive prefix of the stages) and mark them done."""
    for st in stage_registry.stages():
        if st.name not in outputs:
            break
        st.output.give(state, outputs[st.name])
        state.done.add(st.name)
    return state


def stage_counts(states: Iterable[ImageState]) -> dict[str, int]:
    """Images each stage processed in this run (not those filled from the cache)."""
    c: Counter[str] = Counter()
    for s in states:
        c.update(s.computed)
    return {stage: int(c.get(stage, 0)) for stage in stage_registry.names()}


# --------------------------------------------------------------------------------------------
# the store
# --------------------------------------------------------------------------------------------


class StageCache:
    """Stage outputs for one configuration (its identities) under ``{cache}/stages``."""

    def __init__(self, root: str | Path, identities: Mapping[str, str],
                 settings: Mapping[str, Mapping[str, Any]] | None = None, rows_per_part: int = 256):
        self.root = Path(root)
        self.identities = dict(identities)
        self.settings = settings
        self.rows_per_part = rows_per_part
        self._buffers: dict[str, list[dict[str, Any]]] = defaultdict(list)

    @classmethod
    def for_config(cls, cfg: Config, corpus_fingerprint: str) -> "StageCache":
        """``cfg`` resolved."""
        return cls(Path(cfg.cache.stages_dir), stage_identities(cfg, corpus_fingerprint),
                   stage_settings(cfg, corpus_fingerprint), rows_per_part=cfg.ray.rows_per_part)

    def stage_dir(self, stage: str) -> Path:
        return self.root / stage / self.identities[stage]

    def parts(self, stage: str) -> list[Path]:
        return part_paths(self.stage_dir(stage))

    def _read(self, stage: str, wanted: set[str]) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for p in self.parts(stage):
            table = read_part(p)
            if table is None:
                continue
            ids = table.column("image_id").to_pylist()
            keep = [i for i, iid in enumerate(ids) if iid in wanted]
            if not keep:
                continue
            rows = table.take(pa.array(keep, type=pa.int64())).to_pylist()
            for row in rows:
                out[row.pop("image_id")] = row
        return out

    def lookup(self, image_ids: Iterable[str]) -> dict[str, dict[str, dict[str, Any]]]:
        """image id -> {stage: output} for the deepest consecutive prefix of stages stored."""
        remaining = set(image_ids)
        found: dict[str, dict[str, dict[str, Any]]] = {}
        for stage in stage_registry.names():
            if not remaining:
                break
            got = self._read(stage, remaining)
            for iid, o in got.items():
                found.setdefault(iid, {})[stage] = o
            remaining = set(got)  # a later stage only counts on top of this one
        return found

    def prefill(self, states: list[ImageState]) -> list[ImageState]:
        """Fill every state with its stored stage prefix (the stage functions then skip it)."""
        found = self.lookup(s.image_id for s in states if s.ok)
        for s in states:
            if s.image_id in found:
                apply_outputs(s, found[s.image_id])
        return states

    @staticmethod
    def _computed_rows(states: Iterable[ImageState]) -> Iterable[tuple[str, dict[str, Any]]]:
        """(stage, row) for every stage each state computed in this run (failed images: none)."""
        for s in states:
            if not s.ok:
                continue
            for st in stage_registry.stages():
                if st.name in s.computed:
                    yield st.name, {"image_id": s.image_id, **st.output.stored(s)}

    def add(self, states: Iterable[ImageState]) -> None:
        """Buffer the outputs of the stages each state computed in this run (failed images: none)."""
        for stage, row in self._computed_rows(states):
            self._buffers[stage].append(row)
            if len(self._buffers[stage]) >= self.rows_per_part:
                self._flush(stage)

    def flush(self) -> None:
        for stage in list(self._buffers):
            self._flush(stage)

    def store(self, states: Iterable[ImageState]) -> None:
        self.add(states)
        self.flush()

    def write_batch(self, states: Iterable[ImageState]) -> None:
        """The outputs of the stages each state computed, now, one part per stage named for its images
        (:func:`adjcap.storage.parts.content_part_name`): what a pool's last actor writes for its batch, so a
        batch computed again replaces its own parts. Nothing is buffered."""
        batch: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for stage, row in self._computed_rows(states):
            batch[stage].append(row)
        for stage, rows in batch.items():
            self._write(stage, rows, content_part_name(self.identities[stage], (r["image_id"] for r in rows)))

    def _flush(self, stage: str) -> None:
        rows = self._buffers.pop(stage, [])
        if rows:
            self._write(stage, rows)

    def _write(self, stage: str, rows: list[dict[str, Any]], name: str | None = None) -> None:
        d = self.stage_dir(stage)
        if self.settings is not None and not (d / "identity.json").exists():
            names = stage_registry.names()
            upto = names[: names.index(stage) + 1]
            atomic_write_json(d / "identity.json", {s: dict(self.settings[s]) for s in upto})
        write_part(d, pa.Table.from_pylist(rows, schema=stage_registry.stage(stage).output.schema), name)

"""Per-stage outputs shared between runs, content-addressed in the cache.

A stage's output for an image is decided by the stage's own settings and its inputs' identity:

    retrieve : benchmark images, retrieval encoder (a local checkpoint by content), corpus fingerprint, L
    verify   : retrieve identity + the verifier section (a local model by content), k
    caption  : verify identity + the captioner section (checkpoint, CLIP, tokenizer, K, beam, decoding, entities)
    score    : caption identity + the scorer section

Each identity is a hash over its parent's identity and the settings and inputs the stage reads
(:mod:`adjcap.identity`: speed-only settings never count, paths count by content, retrieval counts the
searched corpus and index by content). Outputs live in

    {cache}/stages/<stage>/<identity>/part-*.parquet    image_id + that stage's output columns (cache.stages_dir)
    {cache}/stages/<stage>/<identity>/identity.json     the settings the identity hashes (for people)

written atomically like feature parts (a part is complete or absent; an unreadable part is set aside).
Before extraction every image gets the outputs of its deepest cached stage prefix (:meth:`StageCache.prefill`);
the stage functions skip a stage an image already has (``ImageState.done``) and mark the stages they
computed (``ImageState.computed``), which :meth:`StageCache.store` then writes back. Rows that differ
only after extraction (picker, protocol, alpha/beta) have identical identities at every stage.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import pyarrow as pa

from adjcap.config import Config
from adjcap.identity import content_id, stage_identities, stage_settings  # noqa: F401 - identities live there
from adjcap.features import CANDIDATE, RETRIEVED, VERIFIED
from adjcap.io import atomic_write_json
from adjcap.image_state import STAGES, ImageState
from adjcap.parts import part_paths, read_part, write_part


# --------------------------------------------------------------------------------------------
# what each stage outputs
# --------------------------------------------------------------------------------------------


def _nan_scores(items: list[dict], keys: Iterable[str]) -> list[dict]:
    keys = tuple(keys)
    return [{**x, **{k: math.nan for k in keys}} for x in items]


# what stage 3 writes into a candidate; every other candidate field is a stage-4 score
CAPTION_FIELDS = ("text", "lm_logprob_sum", "lm_logprob_mean", "n_tokens", "beam_rank")
SCORE_FIELDS = tuple(f.name for f in CANDIDATE if f.name not in CAPTION_FIELDS)


@dataclass(frozen=True)
class StageOutput:
    schema: pa.Schema
    take: Callable[[ImageState], dict[str, Any]]  # the stage's own output, as it left the stage
    give: Callable[[ImageState, dict[str, Any]], None]  # put a stored output back into a state


def _give_retrieve(s: ImageState, o: dict[str, Any]) -> None:
    s.retrieved = [dict(r) for r in o["retrieved"]]
    emb = o.get("retrieval_embedding")
    s.retrieval_embedding = None if emb is None else np.asarray(emb, dtype=np.float32)


def _give_verify(s: ImageState, o: dict[str, Any]) -> None:
    s.retrieved = [dict(r) for r in o["retrieved"]]
    s.verified = [dict(v) for v in o["verified"]]
    s.verifier_backend = o.get("verifier_backend")


def _give_caption(s: ImageState, o: dict[str, Any]) -> None:
    s.entities = list(o["entities"] or [])
    s.prompt = o["prompt"]
    s.candidates = [dict(c) for c in o["candidates"]]


def _give_score(s: ImageState, o: dict[str, Any]) -> None:
    s.candidates = [dict(c) for c in o["candidates"]]


OUTPUTS: dict[str, StageOutput] = {
    "retrieve": StageOutput(
        pa.schema([("image_id", pa.string()), ("retrieved", pa.list_(RETRIEVED)),
                   ("retrieval_embedding", pa.list_(pa.float32()))]),
        # the verifier fills the retrieved captions' scores later in the same state: stored without them
        lambda s: {"retrieved": _nan_scores(s.retrieved, ("verifier",)),
                   "retrieval_embedding": None if s.retrieval_embedding is None
                   else np.asarray(s.retrieval_embedding, dtype=np.float32).tolist()},
        _give_retrieve,
    ),
    "verify": StageOutput(
        pa.schema([("image_id", pa.string()), ("retrieved", pa.list_(RETRIEVED)), ("verified", pa.list_(VERIFIED)),
                   ("verifier_backend", pa.string())]),
        lambda s: {"retrieved": s.retrieved, "verified": s.verified, "verifier_backend": s.verifier_backend},
        _give_verify,
    ),
    "caption": StageOutput(
        pa.schema([("image_id", pa.string()), ("entities", pa.list_(pa.string())), ("prompt", pa.string()),
                   ("candidates", pa.list_(CANDIDATE))]),
        # stage 4 fills the candidates' scores later in the same state: stored without them
        lambda s: {"entities": list(s.entities), "prompt": s.prompt,
                   "candidates": _nan_scores(s.candidates, SCORE_FIELDS)},
        _give_caption,
    ),
    "score": StageOutput(
        pa.schema([("image_id", pa.string()), ("candidates", pa.list_(CANDIDATE))]),
        lambda s: {"candidates": s.candidates},
        _give_score,
    ),
}
assert tuple(OUTPUTS) == STAGES


def apply_outputs(state: ImageState, outputs: Mapping[str, dict[str, Any]]) -> ImageState:
    """Fill a state with stored stage outputs (a consecutive prefix of STAGES) and mark them done."""
    for stage in STAGES:
        if stage not in outputs:
            break
        OUTPUTS[stage].give(state, outputs[stage])
        state.done.add(stage)
    return state


def stage_counts(states: Iterable[ImageState]) -> dict[str, int]:
    """Images each stage processed in this run (not those filled from the cache)."""
    c: Counter[str] = Counter()
    for s in states:
        c.update(s.computed)
    return {stage: int(c.get(stage, 0)) for stage in STAGES}


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
        for stage in STAGES:
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

    def add(self, states: Iterable[ImageState]) -> None:
        """Buffer the outputs of the stages each state computed in this run (failed images: none)."""
        for s in states:
            if not s.ok:
                continue
            for stage in STAGES:
                if stage in s.computed:
                    self._buffers[stage].append({"image_id": s.image_id, **OUTPUTS[stage].take(s)})
            for stage in list(self._buffers):
                if len(self._buffers[stage]) >= self.rows_per_part:
                    self._flush(stage)

    def flush(self) -> None:
        for stage in list(self._buffers):
            self._flush(stage)

    def store(self, states: Iterable[ImageState]) -> None:
        self.add(states)
        self.flush()

    def _flush(self, stage: str) -> None:
        rows = self._buffers.pop(stage, [])
        if not rows:
            return
        d = self.stage_dir(stage)
        if self.settings is not None and not (d / "identity.json").exists():
            upto = STAGES[: STAGES.index(stage) + 1]
            atomic_write_json(d / "identity.json", {s: dict(self.settings[s]) for s in upto})
        write_part(d, pa.Table.from_pylist(rows, schema=OUTPUTS[stage].schema))

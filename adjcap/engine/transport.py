"""Per-image states between Ray pools as declared Arrow columns (docs/architecture.md, "Data flow of one
image"): a batch of states travels as one ``pyarrow.Table`` whose columns are the image's own (id,
benchmark, split, domain, error, the encoded image, the pixels the decode task prepared, the stages
done and computed), every stage's output columns as the stage registry declares them
(:attr:`adjcap.engine.stage_registry.Stage.output`: each column once, typed by its schema) and the verifier's image encoding (stage 2's, reused by stage 4) as raw
bytes. No state is pickled; a stage registered beyond the four travels by its declared columns too.

Imports no model library (the decode tasks use it): PyTorch only when a batch carries a verifier
encoding."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np
import pyarrow as pa

from adjcap.engine import stage_registry
from adjcap.engine.image_state import ImageState

_STR = pa.string()
# the pixels the decode task prepared, one entry per geometry (adjcap.engine.pixel_prep): uint8 [height, width, 3]
PIXELS = pa.list_(pa.struct([("key", _STR), ("height", pa.int32()), ("width", pa.int32()), ("data", pa.binary())]))
# the image's own columns, then the verifier's image encoding (not a stage output: stage 4 reuses it)
IMAGE = pa.schema([("image_id", _STR), ("benchmark", _STR), ("split", _STR), ("domain", _STR), ("error", _STR),
                   ("encoded", pa.binary()), ("pixels", PIXELS), ("done", pa.list_(_STR)),
                   ("computed", pa.list_(_STR))])
MEMO = pa.schema([("verifier_memo", pa.binary()), ("verifier_memo_shape", pa.list_(pa.int64())),
                  ("verifier_memo_dtype", _STR)])


_LAYOUTS: dict[tuple[int, ...], tuple] = {}


# the model families that take the verifier's image encoding (stage 2 makes it; the scorer's verifier reuses it)
MEMO_READERS = ("verifier", "scorer")


@dataclass(frozen=True)
class Keep:
    """What a pool's output carries on for the pools after it (:func:`kept_for`): the prepared pixels of
    these geometries (``None``: all), the encoded image, the verifier's encoding. A pool's outputs carry
    only what a later pool reads (docs/architecture.md, "Data flow of one image")."""

    pixels: frozenset[str] | None = None
    encoded: bool = True
    memo: bool = True
    # {pixel key: the ImageState attributes that spare it}: dropped for an image that has them all
    spare: tuple[tuple[str, tuple[str, ...]], ...] = ()


def kept_for(cfg, later: Iterable[str]) -> Keep:
    """What the pools running the stages ``later`` (the stage names after this pool; a LAVIS pool's
    meters count: ``score-verifier``) read of the image: the pixels their models take (their geometries),
    the image's bytes when one decodes it itself (``ray.prepare_pixels`` off, or a model whose
    preprocessing is not known), the verifier's encoding when a later stage runs the verifier."""
    later = tuple(later)
    names = stage_registry.names()
    stages = [s for s in later if s in names]
    preps, known = stage_registry.pixel_preps(cfg, stages)
    reads_image = bool(preps) or not known
    memo = "score-verifier" in later or any(set(MEMO_READERS) & set(stage_registry.stage(s).families)
                                            for s in stages if s != "verify")
    if not cfg.ray.prepare_pixels:
        return Keep(pixels=frozenset(), encoded=reads_image, memo=memo)
    return Keep(pixels=frozenset(p.key for p in preps), encoded=not known, memo=memo, spare=_spared(cfg, stages))


def _spared(cfg, stages: list[str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The pixel keys every later family that wants them reads only for an image lacking something
    (:attr:`adjcap.engine.stage_registry.Family.spare`), with the attributes that spare them."""
    wants: dict[str, list[str | None]] = {}
    for f in stage_registry.families_of(stages):
        fam = stage_registry.family(f)
        spare = fam.spare(cfg)
        for p in fam.pixels(cfg):
            if p is not None:
                wants.setdefault(p.key, []).append(spare.get(p.key))
    return tuple(sorted((k, tuple(sorted(set(attrs)))) for k, attrs in wants.items() if None not in attrs))


def _stage_columns(stages: tuple[stage_registry.Stage, ...]) -> tuple[pa.Schema, tuple[tuple[str, tuple[str, ...]], ...]]:
    """(the transport's schema, (stage name, its output columns) in stage order), once per registry."""
    key = tuple(map(id, stages))
    if key not in _LAYOUTS:
        _LAYOUTS[key] = (*_layout(stages), stages)  # the stages held, so their ids stay theirs
    return _LAYOUTS[key][:2]


def _layout(stages: tuple[stage_registry.Stage, ...]) -> tuple[pa.Schema, tuple[tuple[str, tuple[str, ...]], ...]]:
    fields: dict[str, pa.Field] = {}
    per_stage = []
    for st in stages:
        own = []
        for f in st.output.schema:
            if f.name == "image_id":
                continue
            if f.name in IMAGE.names or f.name in MEMO.names:
                raise ValueError(f"stage '{st.name}': output column '{f.name}' is one of the transport's own")
            if f.name in fields and not fields[f.name].type.equals(f.type):
                raise ValueError(f"stage '{st.name}': output column '{f.name}' is {f.type}, "
                                 f"another stage declares it {fields[f.name].type}")
            fields.setdefault(f.name, f.with_nullable(True))
            own.append(f.name)
        per_stage.append((st.name, tuple(own)))
    return pa.schema([*IMAGE, *fields.values(), *MEMO]), tuple(per_stage)


def schema() -> pa.Schema:
    """The columns a batch travels in: the image's, every registered stage's outputs (each once; two
    stages declaring one column must agree on its type), the verifier's encoding."""
    return _stage_columns(stage_registry.stages())[0]


def pack(states: list[ImageState], drop_image: bool = False, keep: Keep | None = None) -> pa.Table:
    """States -> one table (``drop_image``: without the image and the verifier's encoding: final states;
    ``keep``: only what later pools read, :func:`kept_for`)."""
    keep = Keep(pixels=frozenset(), encoded=False, memo=False) if drop_image else (keep or Keep())
    spare = dict(keep.spare)
    sch, per_stage = _stage_columns(stage_registry.stages())
    cols: dict[str, list] = {n: [] for n in sch.names}
    for s in states:
        cols["image_id"].append(s.image_id)
        cols["benchmark"].append(s.benchmark)
        cols["split"].append(s.split)
        cols["domain"].append(s.domain)
        cols["error"].append(s.error)
        cols["encoded"].append(s.encoded if keep.encoded else None)
        pixels = [{"key": k, "height": a.shape[0], "width": a.shape[1], "data": a.tobytes()}
                  for k, a in (s.pixels or {}).items() if (keep.pixels is None or k in keep.pixels)
                  and not (k in spare and all(getattr(s, attr, None) is not None for attr in spare[k]))]
        cols["pixels"].append(pixels or None)
        cols["done"].append(sorted(s.done))
        cols["computed"].append(sorted(s.computed))
        taken: dict[str, Any] = {}
        if s.ok:
            for name, own in per_stage:
                # a stage's columns once it ran, and the ones a later pool filled before it completed
                # (the lavis backend's verifier half of stage 4 scores the candidates stage 3 made)
                if name in s.done:
                    taken.update(stage_registry.stage(name).output.take(s))
        for n in sch.names[len(IMAGE):len(sch) - len(MEMO)]:  # the stages' columns
            cols[n].append(taken.get(n))
        memo = s.verifier_memo if keep.memo and s.ok else None
        if memo is None:
            cols["verifier_memo"].append(None)
            cols["verifier_memo_shape"].append(None)
            cols["verifier_memo_dtype"].append(None)
        else:
            data, shape, dtype = _tensor_bytes(memo)
            cols["verifier_memo"].append(data)
            cols["verifier_memo_shape"].append(shape)
            cols["verifier_memo_dtype"].append(dtype)
    if drop_image:
        for s in states:
            s.drop_image()
            s.verifier_memo = None
    return pa.Table.from_pydict(cols, schema=sch)


def unpack(table: pa.Table) -> list[ImageState]:
    """A table of :func:`pack` (or of records the driver built: any subset of its columns) -> states."""
    _, per_stage = _stage_columns(stage_registry.stages())
    cols = table.to_pydict()
    n = table.num_rows
    none = [None] * n
    get = lambda k: cols.get(k, none)  # noqa: E731
    out = []
    for i in range(n):
        s = ImageState(get("image_id")[i], get("benchmark")[i], get("split")[i], get("domain")[i] or None,
                       get("error")[i] or None)
        s.encoded = get("encoded")[i]
        s.pixels = {p["key"]: np.frombuffer(p["data"], np.uint8).reshape(p["height"], p["width"], 3)
                    for p in get("pixels")[i] or ()}
        s.computed = set(get("computed")[i] or ())
        done = set(get("done")[i] or ())
        for name, own in per_stage:
            if name in done:
                stage_registry.stage(name).output.give(s, {c: get(c)[i] for c in own})
        s.done = done
        if get("verifier_memo")[i] is not None:
            s.verifier_memo = _tensor(get("verifier_memo")[i], get("verifier_memo_shape")[i],
                                      get("verifier_memo_dtype")[i])
        out.append(s)
    return out


def _tensor_bytes(t) -> tuple[bytes, list[int], str]:
    """A CPU tensor's raw bytes, shape and dtype (bfloat16 has no numpy type: its bits travel as int16)."""
    import torch

    t = t.detach().cpu().contiguous()
    dtype = str(t.dtype).removeprefix("torch.")
    raw = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
    return raw.numpy().tobytes(), list(t.shape), dtype


def _tensor(data: bytes, shape: list[int], dtype: str):
    import torch

    if dtype == "bfloat16":
        return torch.from_numpy(np.frombuffer(data, np.int16).copy()).view(torch.bfloat16).reshape(shape)
    return torch.from_numpy(np.frombuffer(data, np.dtype(dtype)).copy()).reshape(shape)


def columns(cols: dict[str, list]) -> pa.Table:
    """Plain per-image columns as a table (what the last pool hands the driver)."""
    return pa.table(cols)


def records(cols: dict[str, list], stored: list[dict[str, dict[str, Any]] | None] | None = None) -> pa.Table:
    """The driver's input to the decode tasks: the records' columns (the image's own and ``image_path``,
    ``exif``) and, when some image has them, the stage outputs already stored for it (``stored``, per
    image: {stage: its columns} for a prefix of the stages, or None) as the declared columns, with
    ``done`` naming those stages."""
    if stored is None or not any(stored):
        return pa.table(cols)
    sch, per_stage = _stage_columns(stage_registry.stages())
    merged: list[dict[str, Any]] = []
    for outs in stored:
        m: dict[str, Any] = {}
        for name, _ in per_stage:
            if outs and name in outs:
                m.update(outs[name])
        merged.append(m)
    out = dict(cols)
    out["done"] = pa.array([list(o) if o else [] for o in stored], pa.list_(_STR))
    for n in sch.names[len(IMAGE):len(sch) - len(MEMO)]:
        out[n] = pa.array([m.get(n) for m in merged], sch.field(n).type)
    return pa.table(out)

"""The stage registry's mechanism: the records (:class:`Stage`, :class:`Family` and what they hold), the one
table of them, registration and the lookups (docs/architecture.md, "The stage registry"). It knows no
stage: the built-in stages and model families are entries registered on import of
:mod:`adjcap.engine.stage_registry`, the module everything that walks the stages imports (identity, the stage
cache, the pools, the pipeline, the pool actor); a test or an experiment registers its own with
:func:`register` / :func:`registered` (``tests/test_stage_registry.py`` registers a toy one).

* a :class:`Family` is a model a pool loads: how to load it from a resolved config (reusing what
  the same process loaded before it), how big it is without loading it, and the image preparation
  its models want (``pixels``: required, a family without it is refused);
* a :class:`Stage` is a step every image goes through, in order: the pool it runs in, the families
  it needs, the settings it reads (its identity), its output columns (the stage cache) and its
  batch function (``run(states, models, cfg)``).

Imports nothing heavy: PyTorch and the model libraries are imported by the loaders and batch
functions when they run, so the decode tasks and the stage cache stay light.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping

import pyarrow as pa

from adjcap.engine.image_state import ImageState

if TYPE_CHECKING:
    from adjcap.config import Config

# --------------------------------------------------------------------------------------------
# the records
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reads:
    """Dotted config keys a stage reads (a section's name covers every key under it; ``{benchmark}``
    is the run's benchmark; ``scorer.encoder`` is the resolved output-scorer encoder) and, of those,
    the ones read only for speed or identified by content elsewhere (never part of an identity as set)."""

    settings: tuple[str, ...]
    speed: tuple[str, ...] = ()
    by_content: tuple[str, ...] = ()  # read, but identified by what they lead to (an input below)
    # the keys under ``settings`` this config does not read (another family's settings): not in its identity
    unread: Callable[["Config"], tuple[str, ...]] | None = None


@dataclass(frozen=True)
class StageOutput:
    """A stage's output columns (``image_id`` first): what the stage cache stores and what travels
    between pools (``adjcap/engine/transport.py``); how to take them from a state the stage filled and how to
    put them back into a fresh state. ``blank``: struct fields of list columns that a later stage fills
    in the same state, stored as NaN (:meth:`stored`) but carried between pools as they are."""

    schema: pa.Schema
    take: Callable[[ImageState], dict[str, Any]]
    give: Callable[[ImageState, dict[str, Any]], None]
    blank: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def stored(self, s: ImageState) -> dict[str, Any]:
        """The columns the stage cache stores: :attr:`take`'s, with the ``blank`` fields set to NaN."""
        out = self.take(s)
        for col, keys in self.blank.items():
            out[col] = _nan_scores(out[col], keys)
        return out


@dataclass(frozen=True)
class Loading:
    """What a family's loader sees: the models this process loaded before it (by family name), every
    family the process holds, and what the job handed the pool instead of a model file (by family)."""

    models: Mapping[str, Any]
    holds: frozenset[str]
    given: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Family:
    """A model family a pool loads. ``load(cfg, loading)`` (``cfg`` resolved) returns the model;
    ``size(cfg, gpu, holds)`` returns (parameters, bytes at run precision) of what ``load`` would
    load in a process holding the families ``holds`` (reused models count once, where loaded);
    ``pixels(cfg)``: the image preprocessing its models want, without loading them, which the job's
    decode tasks prepare (:mod:`adjcap.engine.pixel_prep`; a None in it: the decoded image itself, so the
    image's bytes travel; ``()``: its models read no image). Required: a family that does not say
    what its models read would get no image at all (:func:`register` refuses it). ``env(cfg)``: the Ray
    runtime environment its models load in when it is not the job's own (None: the job's), e.g. the
    ``lavis`` verifier backend's isolated environment (:mod:`adjcap.models.lavis_env`); ``parts``: what it runs
    of other stages when it loads in an environment of its own, by stage name (the verifier half of stage
    4): a pool of its own runs that part before the stage's pool, which is handed None for this family
    (:func:`adjcap.engine.pools.layout`). ``spare(cfg)``: {pixel key of ``pixels(cfg)``: the
    :class:`ImageState` attribute whose value spares it}: the keys its models read for an image only when
    the image lacks that (the scorer re-encodes an image only when it lost its stage-1 embedding), which
    a pool's output then drops for an image that has it (:func:`adjcap.engine.transport.kept_for`)."""

    name: str
    load: Callable[["Config", Loading], Any]
    size: Callable[["Config", bool, frozenset[str]], tuple[int, int]]
    pixels: Callable[["Config"], tuple[Any, ...]]
    env: Callable[["Config"], Mapping[str, Any] | None] = lambda cfg: None
    parts: Mapping[str, Callable[[list[ImageState], Mapping[str, Any], "Config"], Any]] = field(default_factory=dict)
    spare: Callable[["Config"], Mapping[str, str]] = lambda cfg: {}


@dataclass(frozen=True)
class Stage:
    """A stage, in pipeline order. ``pool``: the pool that runs it when pools are split (:mod:`adjcap.engine.pools`);
    ``families``: the models its batch function reads from ``models``; ``searches_index``: its identity
    counts the searched corpus and index too (:func:`adjcap.engine.identity.stage_settings`)."""

    name: str
    pool: str
    families: tuple[str, ...]
    reads: Reads
    output: StageOutput
    run: Callable[[list[ImageState], Mapping[str, Any], "Config"], Any]
    searches_index: bool = False


_FAMILIES: dict[str, Family] = {}
_STAGES: dict[str, Stage] = {}


def register(*entries: Family | Stage) -> None:
    """Add families and stages (a stage goes after the ones registered before it)."""
    for e in entries:
        table = _FAMILIES if isinstance(e, Family) else _STAGES
        if e.name in table:
            raise ValueError(f"{type(e).__name__.lower()} '{e.name}' is registered already")
        if isinstance(e, Family) and not callable(e.pixels):
            raise ValueError(f"family '{e.name}' says no pixels(cfg): give the image preparation its models want "
                             "((None,): the decoded image; (): no image)")
        if isinstance(e, Stage):
            missing = [f for f in e.families if f not in _FAMILIES]
            if missing:
                raise ValueError(f"stage '{e.name}' needs families {missing} that are not registered")
        table[e.name] = e


@contextlib.contextmanager
def registered(*entries: Family | Stage) -> Iterator[None]:
    """``register`` for the duration of a ``with`` block (tests, experiments)."""
    before = dict(_FAMILIES), dict(_STAGES)
    register(*entries)
    try:
        yield
    finally:
        _FAMILIES.clear()
        _FAMILIES.update(before[0])
        _STAGES.clear()
        _STAGES.update(before[1])


def stages() -> tuple[Stage, ...]:
    """Every stage, in pipeline order."""
    return tuple(_STAGES.values())


def names() -> tuple[str, ...]:
    """The stages' names, in pipeline order (also the names their errors and the stage cache use)."""
    return tuple(_STAGES)


def stage(name: str) -> Stage:
    try:
        return _STAGES[name]
    except KeyError:
        raise KeyError(f"no stage '{name}' (stages: {', '.join(_STAGES)})") from None


def family(name: str) -> Family:
    try:
        return _FAMILIES[name]
    except KeyError:
        raise KeyError(f"no model family '{name}' (families: {', '.join(_FAMILIES)})") from None


def families_of(stage_names: Iterable[str]) -> tuple[str, ...]:
    """The families the given stages need, in registration order (the order they load in)."""
    wanted = {f for s in stage_names for f in stage(s).families}
    return tuple(f for f in _FAMILIES if f in wanted)


def load_families(cfg: "Config", names_: Iterable[str], given: Mapping[str, Any] | None = None,
                  preloaded: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Load the families ``names_`` (``cfg`` resolved) in registration order, each once; a later family
    may reuse an earlier one (the scorer reuses the retrieval encoder and the verifier of its process).
    ``preloaded``: families the caller loaded already (returned with the others, seen by their loaders)."""
    from adjcap.models.precision import set_tf32

    set_tf32(cfg.tf32, cfg.device)  # TF32 for this process's fp32 matmuls on CUDA (the gpu preset's)
    models: dict[str, Any] = dict(preloaded or {})
    holds = frozenset(names_) | frozenset(models)
    for name in (f for f in _FAMILIES if f in holds and f not in models):
        models[name] = _FAMILIES[name].load(cfg, Loading(models, holds, dict(given or {})))
    return models


def pixel_preps(cfg: "Config", stage_names: Iterable[str]) -> tuple[tuple[Any, ...], bool]:
    """(the distinct pixel preparations the families of ``stage_names`` want, whether every one is known):
    the decode tasks prepare them once per image; when one is not known (a model that preprocesses
    otherwise), the image's bytes travel too and that pool decodes them itself."""
    wanted = [p for f in families_of(stage_names) for p in _FAMILIES[f].pixels(cfg)]
    distinct = {p.key: p for p in wanted if p is not None}
    return tuple(distinct.values()), all(p is not None for p in wanted)


def _nan_scores(items: list[dict], keys: Iterable[str]) -> list[dict]:
    keys = tuple(keys)
    return [{**x, **{k: math.nan for k in keys}} for x in items]

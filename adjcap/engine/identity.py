"""What made a stage's output: each stage's identity, built from what the stage reads.

Which settings each stage reads is data: each stage's ``reads`` in the stage registry
(:mod:`adjcap.engine.stage_registry`, docs/architecture.md "Identity"); every identity derives from it:

* :func:`config_identity` - the settings that decide a feature row, flat ``dotted.key: value``
  (:func:`feature_identity`);
* :func:`stage_settings` / :func:`stage_identities` - per stage, the same settings with paths replaced by
  their content, plus the inputs outside the config: the corpus searched (its fingerprint) and the index
  searched (its encoder, corpus and precision as its manifest records them, not its path);
  the stage cache (:mod:`adjcap.engine.stage_cache`), ``provenance.json`` and ``reproduce`` key by these;
* :func:`run_identity` - all of it flat, what a run directory records in ``features/identity.json`` and
  checks on resume.

The corpus is never read here: callers pass its fingerprint (a job's :class:`adjcap.engine.run_plan.RunPlan`
holds it, read once).

A setting a stage reads only for speed (batch sizes, the beam search implementation) is declared under
``speed`` and left out. ``tests/test_identity_property.py`` changes every config setting and checks that
either the identity of each stage whose output changes changes too, or the outputs stay equal, so a new
setting that is not declared there fails that test by name.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from adjcap.config import Config
from adjcap.storage.content_ids import file_content_id
from adjcap.nested import flatten
from adjcap.engine import stage_registry


def config_view(cfg: Config) -> dict[str, Any]:
    """Every setting flat, with ``scorer.encoder`` resolved (None means the retrieval encoder)."""
    data = cfg.model_dump(mode="json")
    data["scorer"]["encoder"] = cfg.scorer_encoder().model_dump(mode="json")
    return flatten(data)


# Settings added after runs existed, each at the value that computes what those runs computed: at that
# value a setting stays out of every identity, so the runs and stage caches made before it existed keep
# resuming; any other value enters the identity like every setting (docs/architecture.md, "Identity").
ADDED_LATER: dict[str, Any] = {
    "tf32": False,                      # exact fp32 matmuls
    "retrieval.corpus": None,           # the benchmark's own corpus
    "verifier.attention": "eager",      # transformers' own BLIP attention
    "verifier.long_captions": "whole",  # each text judged as one caption
    "*.text_token_budget": 0,           # one text batch per batch size, padded to its longest
}


def neutral(key: str, value: Any) -> bool:
    """``key`` is a setting of :data:`ADDED_LATER` at its old behaviour's value."""
    for pattern, old in ADDED_LATER.items():
        hit = key.endswith(pattern[1:]) if pattern.startswith("*") else key == pattern
        if hit and value == old:
            return True
    return False


def _covers(pattern: str, key: str) -> bool:
    return key == pattern or key.startswith(pattern + ".")


def stage_of(cfg: Config, key: str) -> str | None:
    """The stage whose identity a flat setting belongs to (the first that reads it and does not declare
    it unread), or None when no stage reads it or it is read only for speed."""
    for st in stage_registry.stages():
        stage, reads = st.name, st.reads
        names = [p.replace("{benchmark}", cfg.benchmark) for p in reads.settings]
        if any(_covers(p, key) for p in names):
            if any(_covers(p, key) for p in reads.speed + reads.by_content):
                return None
            if reads.unread and any(_covers(p, key) for p in reads.unread(cfg)):
                continue  # not this stage's: a later stage may read it (verifier.long_captions: stage 4)
            return stage
    return None


def config_identity(cfg: Config) -> dict[str, dict[str, Any]]:
    """stage -> {dotted key: value} of the settings it reads (not for speed), as configured."""
    out: dict[str, dict[str, Any]] = {s: {} for s in stage_registry.names()}
    for key, value in sorted(config_view(cfg).items()):
        stage = None if neutral(key, value) else stage_of(cfg, key)
        if stage is not None:
            out[stage][key] = value
    return out


def feature_identity(cfg: Config) -> dict[str, Any]:
    """The settings that decide what a feature row holds, flat ``dotted.key: value``: those the stages
    read (their registry records' ``reads``), not those read only for speed nor anything applied after extraction
    (rerank, eval). Equal identities write interchangeable rows."""
    return {k: v for d in config_identity(cfg).values() for k, v in d.items()}


# configs a loader reads beside a checkpoint file (open_clip: the model config of a local checkpoint)
SIDE_CONFIGS = ("open_clip_config.json",)


def content_id(value: Any) -> Any:
    """A path-valued setting by content (a file: size + digest; a directory: its files' names and
    digests), so the same model under another path shares outputs and a rewritten file does not.
    Anything that is not an existing path is returned as is (hub ids, numbers, names)."""
    if not isinstance(value, str) or not value or ("/" not in value and not value.startswith(".")):
        return value
    p = Path(value)
    try:
        if p.is_file():  # and the configs beside it, which loaders read too (open_clip_config.json)
            side = [f"{x.name}:{file_content_id(x)}" for x in (p.parent / n for n in SIDE_CONFIGS) if x != p and x.is_file()]
            return f"file:{file_content_id(p)}" + (f"+{'+'.join(side)}" if side else "")
        if p.is_dir():
            h = hashlib.sha256()
            for f in sorted(x for x in p.rglob("*") if x.is_file() and not x.name.startswith(".")):
                h.update(f"{f.relative_to(p)}\0{file_content_id(f)}\0".encode())
            return f"dir:{h.hexdigest()[:16]}"
    except OSError:
        return value
    return value


def searched_index(cfg: Config, corpus_fingerprint: str) -> str:
    """The index a run searches, by content (``cfg`` resolved)."""
    from adjcap.index.lifecycle import encoder_identity, index_identity

    return index_identity(cfg.retrieval, cfg.paths.cache_dir, encoder_identity(cfg.retrieval.encoder),
                          corpus_fingerprint)


def stage_settings(cfg: Config, corpus_fingerprint: str) -> dict[str, dict[str, Any]]:
    """Each stage's own settings (``cfg`` resolved), paths replaced by their content, and the corpus
    and index retrieval searched."""
    out = {s: {k: (v if k.startswith("benchmarks.") else content_id(v)) for k, v in d.items()}
           for s, d in config_identity(cfg).items()}  # the image root by name: its files are the image ids
    from adjcap.models.precision import tf32_in_effect

    tf32 = tf32_in_effect(cfg.tf32, cfg.device)
    tf32_stage = stage_of(cfg, "tf32")
    if tf32 is not None and tf32_stage is not None:  # only on CUDA: a CPU run's identity is as before
        out[tf32_stage]["tf32_in_effect"] = tf32  # the switch's effect: ROCm ignores it (other beams)
    for st in stage_registry.stages():
        if st.searches_index:
            out[st.name]["corpus_fingerprint"] = corpus_fingerprint
            out[st.name]["index"] = searched_index(cfg, corpus_fingerprint)
    return out


def stage_identities(cfg: Config, corpus_fingerprint: str) -> dict[str, str]:
    """stage -> identity hash; each stage's hash covers its parent's."""
    return identities_of(stage_settings(cfg, corpus_fingerprint))


def identities_of(settings: dict[str, dict[str, Any]]) -> dict[str, str]:
    """stage -> identity hash of :func:`stage_settings`' output, each stage's hash covering its parent's."""
    out: dict[str, str] = {}
    parent = ""
    for stage in stage_registry.names():
        doc = json.dumps({"stage": stage, "parent": parent, "settings": settings[stage]}, sort_keys=True, default=str)
        parent = out[stage] = hashlib.sha256(doc.encode()).hexdigest()[:24]
    return out


def run_identity(cfg: Config, corpus_fingerprint: str) -> dict[str, Any]:
    """Everything that decides a run's feature rows, flat (``cfg`` resolved): what a run directory
    records and compares on resume (the stage settings of :func:`stage_settings`)."""
    return flat_identity(stage_settings(cfg, corpus_fingerprint))


def flat_identity(settings: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """:func:`stage_settings`' output flat, as :func:`run_identity` returns it."""
    flat: dict[str, Any] = {}
    for d in settings.values():
        flat.update(d)
    return flat

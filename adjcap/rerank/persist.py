"""Saving and loading fitted heads: ``trifuse.safetensors``, ``memattend.safetensors``, ``heads.json``.

``heads.json`` holds the format tag, each head's constructor config, parameter count and per-epoch
training losses, plus the fit metadata (seed, fit split, number of images, lm_feature, alpha, beta,
...). Every file is written atomically (temp name in the same directory, then ``os.replace``);
``heads.json`` is written last, so a directory with a ``heads.json`` is complete.
Loading rebuilds each head from its config and refuses any missing, unexpected or mis-shaped tensor,
and (when a config is given) any mismatch between the saved and the configured architecture.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from adjcap.config import Config, RerankCfg
from adjcap.storage.io import atomic_write_bytes, atomic_write_json
from adjcap.rerank.heads import HEADS, Heads, count_params

FORMAT = "adjcap-heads/1"


class HeadsMismatchError(ValueError):
    """Saved heads do not fit the expected architecture; the message names the tensor or field."""


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    if hasattr(obj, "item"):
        return obj.item()
    return str(obj)


def save_heads(directory: str | Path, heads: Heads, meta: dict[str, Any] | None = None) -> Path:
    """Write the present heads and ``heads.json`` into ``directory``; returns the json path."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    info: dict[str, Any] = {"format": FORMAT, "meta": _jsonable({**heads.meta, **(meta or {})}), "heads": {}}
    for name in heads.available():
        head, spec = heads.get(name), HEADS.get(name)
        state = {k: v.detach().to("cpu").contiguous().clone() for k, v in head.state_dict().items()}
        atomic_write_bytes(d / spec.file, st_save(state, metadata={"format": FORMAT, "head": name}))
        info["heads"][name] = {
            "file": spec.file,
            "config": head.config(),
            "n_params": count_params(head),
            "losses": [float(x) for x in heads.losses.get(name, [])],
        }
    if not info["heads"]:
        raise ValueError(f"save_heads: no head to save (none of {', '.join(HEADS)} is fitted)")
    return atomic_write_json(d / "heads.json", info)


def _expected_configs(cfg: Config | RerankCfg | None) -> dict[str, dict[str, Any]]:
    if cfg is None:
        return {}
    r = cfg.rerank if isinstance(cfg, Config) else cfg
    return {name: {k: getattr(spec.settings(r), k) for k in spec.arch} for name, spec in HEADS.items()}


def load_heads(directory: str | Path, cfg: Config | RerankCfg | None = None) -> Heads:
    """Load heads saved by :func:`save_heads`. With ``cfg``, the saved architecture must match the
    configured one (``rerank.trifuse.*``, ``rerank.memattend.*``). Raises :class:`HeadsMismatchError`
    naming the offending tensor or field; ``FileNotFoundError`` naming the missing file."""
    d = Path(directory)
    jpath = d / "heads.json"
    if not jpath.exists():
        raise FileNotFoundError(f"{jpath}: no saved heads here (written by the fit step as heads/heads.json)")
    try:
        info = json.loads(jpath.read_text())
    except json.JSONDecodeError as e:
        raise HeadsMismatchError(f"{jpath}: not valid JSON ({e})") from e
    if info.get("format") != FORMAT:
        raise HeadsMismatchError(f"{jpath}: format {info.get('format')!r}, expected {FORMAT!r}")
    expected = _expected_configs(cfg)
    out = Heads(meta=dict(info.get("meta", {})))
    for name, entry in info.get("heads", {}).items():
        if name not in HEADS:
            raise HeadsMismatchError(f"{jpath}: {HEADS.unknown(name)}")
        spec = HEADS.get(name)
        saved_cfg = dict(entry.get("config", {}))
        for key, want in expected.get(name, {}).items():
            if saved_cfg.get(key) != want:
                raise HeadsMismatchError(
                    f"{jpath}: {name}.{key} = {saved_cfg.get(key)!r} in the saved heads but "
                    f"rerank.{name}.{key} = {want!r} in the config; refit the heads or change the config"
                )
        try:
            head = spec.cls(**saved_cfg)
        except TypeError as e:
            raise HeadsMismatchError(f"{jpath}: bad {name} config {saved_cfg}: {e}") from e
        fpath = d / entry.get("file", spec.file)
        if not fpath.exists():
            raise FileNotFoundError(f"{fpath}: missing weights for the {name} head listed in {jpath}")
        tensors = st_load(fpath.read_bytes())
        want_state = head.state_dict()
        missing = [k for k in want_state if k not in tensors]
        unexpected = [k for k in tensors if k not in want_state]
        if missing:
            raise HeadsMismatchError(f"{fpath}: tensor '{missing[0]}' is missing ({len(missing)} missing in all)")
        if unexpected:
            raise HeadsMismatchError(f"{fpath}: unexpected tensor '{unexpected[0]}' for a {name} head {saved_cfg}")
        for k, v in want_state.items():
            if tuple(tensors[k].shape) != tuple(v.shape):
                raise HeadsMismatchError(
                    f"{fpath}: tensor '{k}' has shape {tuple(tensors[k].shape)}, "
                    f"expected {tuple(v.shape)} for a {name} head {saved_cfg}"
                )
            if tensors[k].dtype != v.dtype:
                raise HeadsMismatchError(f"{fpath}: tensor '{k}' has dtype {tensors[k].dtype}, expected {v.dtype}")
        head.load_state_dict(tensors, strict=True)
        head.eval()
        setattr(out, name, head)
        out.losses[name] = [float(x) for x in entry.get("losses", [])]
    if not out.available():
        raise HeadsMismatchError(f"{jpath}: lists no heads")
    return out

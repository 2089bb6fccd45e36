"""The tiny open_clip models (their configs in ``adjcap/demo/configs``, registered with open_clip on
import), saved like a hub snapshot: weights as safetensors with an ``open_clip_config.json`` beside
them, so open_clip's ``local-dir:`` loading rebuilds them.

``adjcap-tiny-clip`` (16-pixel patches: IFCap's ViT-B/32 role) and ``adjcap-tiny-clip-large`` (the
same widths with 8-pixel patches, four times the image tokens: the retrieval judge, ViT-bigG-14's
role)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import open_clip
import torch

from adjcap.models.clip import quiet_random_init
from adjcap.storage.io import atomic_write_bytes, atomic_write_json
from adjcap.models.sources import OPEN_CLIP_CONFIG, PREPROCESS_KEYS

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
TINY_CLIP = "adjcap-tiny-clip"
TINY_CLIP_LARGE = "adjcap-tiny-clip-large"

open_clip.add_model_config(CONFIG_DIR)  # idempotent: open_clip rescans the directory


def build_tiny_clip(path: str | os.PathLike, seed: int = 42, embed_dim: int | None = None,
                    model: str = TINY_CLIP, resize_mode: str = "squash") -> Path:
    """Save a deterministic random tiny open_clip ``model`` as safetensors at ``path``.

    An ``open_clip_config.json`` (model config + preprocessing) is written beside it, so
    ``load_dual_encoder("adjcap-tiny-clip", str(path))`` rebuilds exactly this model (also with a
    non-default ``embed_dim``). Returns ``path``.

    ``resize_mode``: how the model's preprocessing fits an image to its square input (open_clip's
    ``squash``, ``shortest`` = resize and centre-crop, or ``longest``). The demo world's scenes are
    4:3, 1:1 and 3:4 with objects up to their edges: a centre crop would cut a quarter of a wide
    scene away, and with it the objects a caption names, so the tiny CLIPs squash.
    """
    from safetensors.torch import save

    path = Path(path)
    if resize_mode not in ("squash", "shortest", "longest"):
        raise ValueError(f"resize_mode must be 'squash', 'shortest' or 'longest', got {resize_mode!r}")
    if path.suffix != ".safetensors":
        raise ValueError(f"{path}: the tiny CLIP is saved as safetensors; give a *.safetensors path")
    model_cfg = open_clip.get_model_config(model)
    if model_cfg is None:
        raise ValueError(f"unknown open_clip model '{model}'")
    kwargs = {}
    if embed_dim is not None and embed_dim != model_cfg["embed_dim"]:
        kwargs["embed_dim"] = int(embed_dim)
        model_cfg["embed_dim"] = int(embed_dim)
    with torch.random.fork_rng(devices=[]), quiet_random_init():  # random by design: before its training
        torch.manual_seed(seed)
        net = open_clip.create_model(model, pretrained=None, precision="fp32", device="cpu", **kwargs)
    state = {k: v.detach().contiguous().clone() for k, v in net.state_dict().items()}
    atomic_write_bytes(path, save(state, metadata={"adjcap": json.dumps({"model": model, "seed": seed})}))
    pp = dict(open_clip.get_model_preprocess_cfg(net))
    pp = {k: (list(v) if isinstance(v, tuple) else v) for k, v in pp.items() if k in PREPROCESS_KEYS}
    pp["resize_mode"] = resize_mode
    atomic_write_json(path.parent / OPEN_CLIP_CONFIG, {"model_name": model, "model_cfg": model_cfg, "preprocess_cfg": pp})
    return path

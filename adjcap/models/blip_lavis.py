"""LAVIS BLIP ITM checkpoints (``.pth``) in the transformers backend, and LAVIS's eval image transform.

A LAVIS ``blip_image_text_matching`` checkpoint (the released ``model_large_retrieval_coco.pth`` /
``model_large_retrieval_flickr.pth``, or a ``state_dict`` saved from LAVIS's ``BlipITM``) is read with
``torch.load(weights_only=True)``, its keys renamed to the transformers ``BlipForImageTextRetrieval``
layout, and loaded strictly: every key of the file is either used or in the explicit list of training
state that ITM never reads (:data:`ITM_UNUSED_PREFIXES`, :data:`ITM_UNUSED_KEYS`); every parameter of
the model must come from the file. Anything else is a one-line :class:`LavisCheckpointError` naming the
file and the first offending keys.

The transformers config is read off the tensor shapes (widths, depths, patch and image size, vocabulary,
positions, projection width); the attention head counts are not in the shapes and follow LAVIS's models
(ViT-B/16, ViT-L/16 and BERT-base all use 64-wide heads): heads = width / 64. Fixed LAVIS facts: ViT
LayerNorm eps 1e-6, exact GELU, qkv bias; BERT LayerNorm eps 1e-12, absolute positions, no token types,
cross-attention in every layer; [DEC] and [ENC] appended after the BERT vocabulary.

The tokenizer is not in the file: LAVIS builds it from ``bert-base-uncased`` and appends [DEC] (as bos)
and [ENC]; ``tokenizer=`` names that BERT tokenizer (hub id or local directory) and the same two tokens
are appended here.

:class:`LavisEvalTransform` is LAVIS's ``blip_image_eval`` processor written out: PIL resize to a square
(no aspect ratio, no crop) with PIL bicubic, ``/255`` in float32, per-channel normalisation; it is called
like a transformers image processor (``proc(images=..., return_tensors="pt")["pixel_values"]``).
"""

from __future__ import annotations

import hashlib
import math
import os
import pickle
import re
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from adjcap.engine.pixel_prep import PixelPrep

# Training state of a LAVIS/BLIP *retrieval* checkpoint that ITM never reads: the momentum encoders and
# projections, the contrastive queues, the queue pointer (LAVIS names it queue_ptr, BLIP ptr_queue) and
# the contrastive temperature.
ITM_UNUSED_PREFIXES: tuple[str, ...] = ("visual_encoder_m.", "text_encoder_m.", "vision_proj_m.", "text_proj_m.")
ITM_UNUSED_KEYS: tuple[str, ...] = ("image_queue", "text_queue", "idx_queue", "queue_ptr", "ptr_queue", "temp")

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
HEAD_WIDTH = 64  # LAVIS's ViT-B/16, ViT-L/16 and BERT-base: 64-wide attention heads
VISION_LN_EPS = 1e-6
TEXT_LN_EPS = 1e-12
POSITION_IDS = "text_encoder.embeddings.position_ids"

_VISION_RULES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p), r)
    for p, r in (
        (r"^visual_encoder\.cls_token$", "vision_model.embeddings.class_embedding"),
        (r"^visual_encoder\.pos_embed$", "vision_model.embeddings.position_embedding"),
        (r"^visual_encoder\.patch_embed\.proj\.(weight|bias)$", r"vision_model.embeddings.patch_embedding.\1"),
        (r"^visual_encoder\.blocks\.(\d+)\.norm1\.(weight|bias)$", r"vision_model.encoder.layers.\1.layer_norm1.\2"),
        (r"^visual_encoder\.blocks\.(\d+)\.norm2\.(weight|bias)$", r"vision_model.encoder.layers.\1.layer_norm2.\2"),
        (r"^visual_encoder\.blocks\.(\d+)\.attn\.qkv\.(weight|bias)$", r"vision_model.encoder.layers.\1.self_attn.qkv.\2"),
        (r"^visual_encoder\.blocks\.(\d+)\.attn\.proj\.(weight|bias)$",
         r"vision_model.encoder.layers.\1.self_attn.projection.\2"),
        (r"^visual_encoder\.blocks\.(\d+)\.mlp\.(fc1|fc2)\.(weight|bias)$", r"vision_model.encoder.layers.\1.mlp.\2.\3"),
        (r"^visual_encoder\.norm\.(weight|bias)$", r"vision_model.post_layernorm.\1"),
        (r"^(text_encoder\.(?:embeddings|encoder)\..+)$", r"\1"),
        (r"^((?:vision_proj|text_proj|itm_head)\.(?:weight|bias))$", r"\1"),
    )
)


class LavisCheckpointError(ValueError):
    """A ``.pth`` that is not a complete LAVIS BLIP ITM checkpoint; the message names the file."""


def _first(keys: Sequence[str], n: int = 3) -> str:
    keys = sorted(keys)
    more = f" (+{len(keys) - n} more)" if len(keys) > n else ""
    return ", ".join(keys[:n]) + more


def is_itm_unused(key: str) -> bool:
    return key in ITM_UNUSED_KEYS or key.startswith(ITM_UNUSED_PREFIXES)


def read_lavis_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The tensors of a LAVIS checkpoint (``{"model": state_dict}`` or a bare ``state_dict``), read with
    ``weights_only=True``."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: LAVIS checkpoint not found (verifier.model names a .pth file)")
    try:
        obj = torch.load(p, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise LavisCheckpointError(
            f"{p}: not a loadable weights-only checkpoint ({first}); give the LAVIS .pth file itself "
            f"(e.g. model_large_retrieval_coco.pth)"
        ) from e
    sd = obj.get("model", obj) if isinstance(obj, Mapping) else None
    if not isinstance(sd, Mapping) or not sd:
        raise LavisCheckpointError(f"{p}: holds no state_dict (expected {{'model': state_dict}} or a state_dict)")
    bad = [str(k) for k, v in sd.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
    if bad:
        raise LavisCheckpointError(f"{p}: non-tensor entries in the state_dict: {_first(bad)}")
    return dict(sd)


def lavis_to_transformers(sd: Mapping[str, torch.Tensor], path: str | os.PathLike = "<state_dict>"
                          ) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Rename a LAVIS ITM state_dict to the ``BlipForImageTextRetrieval`` layout.

    Returns the renamed tensors and the keys dropped as ITM-unused training state. A key that is neither
    renamed nor known-unused is an error naming the file and the first such keys."""
    out: dict[str, torch.Tensor] = {}
    dropped: list[str] = []
    unexpected: list[str] = []
    for key, value in sd.items():
        if key == POSITION_IDS:  # a buffer: transformers rebuilds it; it must be the plain arange
            n = value.shape[-1]
            if not torch.equal(value.reshape(-1).long(), torch.arange(n)):
                raise LavisCheckpointError(f"{path}: {POSITION_IDS} is not arange({n})")
            dropped.append(key)
            continue
        if is_itm_unused(key):
            dropped.append(key)
            continue
        for pattern, repl in _VISION_RULES:
            if pattern.match(key):
                out[pattern.sub(repl, key)] = value
                break
        else:
            unexpected.append(key)
    if unexpected:
        raise LavisCheckpointError(
            f"{path}: not a LAVIS BLIP ITM checkpoint: unexpected keys {_first(unexpected)}"
        )
    return out, dropped


def _count(sd: Mapping[str, torch.Tensor], pattern: str) -> int:
    rx = re.compile(pattern)
    return len({m.group(1) for k in sd if (m := rx.match(k))})


def lavis_dims(sd: Mapping[str, torch.Tensor], path: str | os.PathLike = "<state_dict>") -> dict[str, int]:
    """The architecture of a LAVIS ITM state_dict (LAVIS names), read off its tensor shapes; head counts
    are width / 64 as in every LAVIS BLIP model."""
    need = ["visual_encoder.patch_embed.proj.weight", "visual_encoder.pos_embed",
            "visual_encoder.blocks.0.mlp.fc1.weight", "text_encoder.embeddings.word_embeddings.weight",
            "text_encoder.embeddings.position_embeddings.weight",
            "text_encoder.encoder.layer.0.intermediate.dense.weight",
            "text_encoder.encoder.layer.0.crossattention.self.key.weight", "vision_proj.weight"]
    missing = [k for k in need if k not in sd]
    if missing:
        raise LavisCheckpointError(f"{path}: not a LAVIS BLIP ITM checkpoint: missing keys {_first(missing)}")
    patch = sd["visual_encoder.patch_embed.proj.weight"]
    width, patch_size = int(patch.shape[0]), int(patch.shape[-1])
    n_pos = int(sd["visual_encoder.pos_embed"].shape[1]) - 1
    grid = math.isqrt(n_pos)
    if grid * grid != n_pos:
        raise LavisCheckpointError(f"{path}: visual_encoder.pos_embed has {n_pos} patch positions (not a square grid)")
    vocab, text_width = (int(x) for x in sd["text_encoder.embeddings.word_embeddings.weight"].shape)
    for w, what in ((width, "vision"), (text_width, "text")):
        if w % HEAD_WIDTH:
            raise LavisCheckpointError(f"{path}: {what} width {w} is not a multiple of the {HEAD_WIDTH}-wide "
                                       "heads of LAVIS's BLIP models")
    return dict(
        vision_width=width,
        vision_layers=_count(sd, r"^visual_encoder\.blocks\.(\d+)\."),
        vision_heads=width // HEAD_WIDTH,
        vision_mlp=int(sd["visual_encoder.blocks.0.mlp.fc1.weight"].shape[0]),
        patch_size=patch_size,
        image_size=grid * patch_size,
        text_width=text_width,
        text_layers=_count(sd, r"^text_encoder\.encoder\.layer\.(\d+)\."),
        text_heads=text_width // HEAD_WIDTH,
        text_intermediate=int(sd["text_encoder.encoder.layer.0.intermediate.dense.weight"].shape[0]),
        vocab_size=vocab,
        max_positions=int(sd["text_encoder.embeddings.position_embeddings.weight"].shape[0]),
        encoder_width=int(sd["text_encoder.encoder.layer.0.crossattention.self.key.weight"].shape[1]),
        embed_dim=int(sd["vision_proj.weight"].shape[0]),
    )


def infer_blip_config(sd: Mapping[str, torch.Tensor], path: str | os.PathLike = "<state_dict>") -> Any:
    """A ``BlipConfig`` matching a LAVIS ITM state_dict (already in LAVIS names)."""
    from transformers import BlipConfig

    d = lavis_dims(sd, path)
    return BlipConfig(
        text_config=dict(
            vocab_size=d["vocab_size"],
            hidden_size=d["text_width"],
            encoder_hidden_size=d["encoder_width"],
            intermediate_size=d["text_intermediate"],
            num_hidden_layers=d["text_layers"],
            num_attention_heads=d["text_heads"],
            max_position_embeddings=d["max_positions"],
            hidden_act="gelu",
            layer_norm_eps=TEXT_LN_EPS,
            pad_token_id=0,
            bos_token_id=d["vocab_size"] - 2,  # [DEC]; [ENC] = vocab - 1
            sep_token_id=102 if d["vocab_size"] > 102 else None,
            is_decoder=True,
        ),
        vision_config=dict(
            hidden_size=d["vision_width"],
            intermediate_size=d["vision_mlp"],
            num_hidden_layers=d["vision_layers"],
            num_attention_heads=d["vision_heads"],
            image_size=d["image_size"],
            patch_size=d["patch_size"],
            hidden_act="gelu",
            layer_norm_eps=VISION_LN_EPS,
        ),
        image_text_hidden_size=d["embed_dim"],
    )


def build_itm_model(sd: Mapping[str, torch.Tensor], path: str | os.PathLike = "<state_dict>") -> Any:
    """A ``BlipForImageTextRetrieval`` (fp32, eval) holding the weights of a LAVIS ITM state_dict; strict:
    every model tensor comes from the file and every file tensor is used or known-unused."""
    from transformers import BlipForImageTextRetrieval

    hf, _ = lavis_to_transformers(sd, path)  # first: a foreign file is named by its own keys
    config = infer_blip_config(sd, path)
    with torch.device("meta"):
        net = BlipForImageTextRetrieval(config)
    expected = net.state_dict()
    missing = [k for k in expected if k not in hf]
    unexpected = [k for k in hf if k not in expected]
    if missing or unexpected:
        what = [f"missing {_first(missing)}"] if missing else []
        what += [f"unexpected {_first(unexpected)}"] if unexpected else []
        raise LavisCheckpointError(f"{path}: keys do not match a BLIP ITM model: {'; '.join(what)}")
    shapes = [f"{k} {tuple(hf[k].shape)} vs {tuple(v.shape)}" for k, v in expected.items() if hf[k].shape != v.shape]
    if shapes:
        raise LavisCheckpointError(f"{path}: tensor shapes do not fit one BLIP ITM model: {_first(shapes, 2)}")
    net.load_state_dict({k: v.float() for k, v in hf.items()}, strict=True, assign=True)
    net.text_encoder.embeddings.register_buffer(  # the non-persistent buffer the meta build left empty
        "position_ids", torch.arange(config.text_config.max_position_embeddings).unsqueeze(0), persistent=False
    )
    return net.eval()


def lavis_tokenizer(source: str, cache_dir: str | None = None, local_files_only: bool = False) -> Any:
    """LAVIS ``BlipBase.init_tokenizer``: the BERT tokenizer plus [DEC] (bos) and [ENC] (additional special)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(source, cache_dir=cache_dir, local_files_only=local_files_only)
    tok.add_special_tokens({"bos_token": "[DEC]"})
    tok.add_special_tokens({"additional_special_tokens": ["[ENC]"]})
    return tok


def file_fingerprint(path: Path) -> str:
    """Name, size and the first and last 64 MiB of a file (checkpoints are large)."""
    size = path.stat().st_size
    h = hashlib.sha256(path.name.encode() + str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(64 << 20))
        if size > (128 << 20):
            f.seek(size - (64 << 20))
            h.update(f.read(64 << 20))
    return "sha256s:" + h.hexdigest()[:16]


def load_lavis_checkpoint(path: str | os.PathLike, *, tokenizer: str = "bert-base-uncased",
                          cache_dir: str | None = None, local_files_only: bool = False
                          ) -> tuple[Any, Any, LavisEvalTransform, str]:
    """(model, tokenizer, image transform, model id) for a LAVIS ``.pth``; the model is fp32 on CPU."""
    p = Path(os.path.expanduser(str(path)))
    sd = read_lavis_state_dict(p)
    net = build_itm_model(sd, p)
    try:
        tok = lavis_tokenizer(tokenizer, cache_dir=cache_dir, local_files_only=local_files_only)
    except OSError as e:
        raise FileNotFoundError(
            f"{p}: the BERT tokenizer '{tokenizer}' for this LAVIS checkpoint is not available "
            f"({str(e).splitlines()[0]}); set verifier.tokenizer to a local bert-base-uncased tokenizer directory"
        ) from e
    vocab = net.config.text_config.vocab_size
    if len(tok) != vocab:
        raise LavisCheckpointError(
            f"{p}: tokenizer '{tokenizer}' + [DEC], [ENC] has {len(tok)} tokens but the checkpoint's text "
            f"embedding has {vocab}; set verifier.tokenizer to the BERT tokenizer the checkpoint was trained with"
        )
    image = LavisEvalTransform(net.config.vision_config.image_size)
    return net, tok, image, f"{p.name}/{file_fingerprint(p)}"


class LavisEvalTransform:
    """LAVIS ``BlipImageEvalProcessor``: ``Resize((S, S), BICUBIC)`` on the PIL image, ``ToTensor()``,
    ``Normalize(mean, std)``, written with PIL and torch (same operations, same float32 arithmetic)."""

    def __init__(self, image_size: int = 384, mean: Sequence[float] = OPENAI_CLIP_MEAN,
                 std: Sequence[float] = OPENAI_CLIP_STD, resample: int = Image.BICUBIC) -> None:
        self.image_size = int(image_size)
        self.mean = torch.tensor(mean, dtype=torch.float32).view(3, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(3, 1, 1)
        self.resample = int(resample)
        # the same transform split in its CPU and device halves (:mod:`adjcap.engine.pixel_prep`)
        self.pixel_prep = PixelPrep(self.image_size, self.image_size, "squash", self.resample,
                                    mean=tuple(float(v) for v in mean), std=tuple(float(v) for v in std))

    @classmethod
    def like(cls, processor: Any) -> LavisEvalTransform:
        """The same transform with the size, mean, std and resampling of a transformers
        ``BlipImageProcessor`` (a hub or save_pretrained verifier's preprocessor_config.json)."""
        size = processor.size
        if isinstance(size, int):
            side = width = size
        else:
            get = size.get if isinstance(size, Mapping) else lambda k: getattr(size, k, None)
            side, width = get("height"), get("width")
        if side is None or width != side:
            raise ValueError(f"verifier image processor size {size} is not a square height/width "
                             "(LAVIS's eval transform squashes to a square)")
        resample = processor.resample
        resample = int(getattr(resample, "value", resample)) if resample is not None else Image.BICUBIC
        return cls(side, processor.image_mean, processor.image_std, resample)

    def one(self, image: Image.Image) -> torch.Tensor:
        im = image if image.mode == "RGB" else image.convert("RGB")
        im = im.resize((self.image_size, self.image_size), self.resample)
        x = torch.from_numpy(np.array(im, dtype=np.uint8, copy=True)).permute(2, 0, 1).float().div(255)
        return (x - self.mean) / self.std

    def __call__(self, images: Sequence[Image.Image] | Image.Image, return_tensors: str = "pt") -> dict[str, torch.Tensor]:
        if isinstance(images, Image.Image):
            images = [images]
        return {"pixel_values": torch.stack([self.one(im) for im in images])}

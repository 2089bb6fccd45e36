"""How much memory each pool's models take, estimated without loading them (the doctor and the
benchmarks read it; the Ray job's memory requests come from the same numbers).

``pool_budget(cfg, gpu=None)`` -> ``{pool: {"params": n, "bytes": b}}``: parameters of the models a pool
holds (a table of the known architectures; a local safetensors file's header or another weights file's
size / 4 otherwise) times the bytes per parameter of the precision they run in. Pure: never imports a
model library.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, Iterable

CLIP_TOWERS: dict[str, dict[str, int]] = {  # open_clip, parameters per tower
    "ViT-bigG-14": {"image": 1_844_907_264, "text": 694_659_841},
    "ViT-B-32": {"image": 87_849_216, "text": 63_428_097},
    "ViT-B-32-quickgelu": {"image": 87_849_216, "text": 63_428_097},
    "RN50x64": {"image": 420_380_352, "text": 202_877_953},
}
BLIP_ITM_LARGE = 446_128_642  # BlipForImageTextRetrieval, ViT-L/16 384 px + BERT-base
IFCAP_PARAMS = 124_439_808 + 46_864_128  # GPT-2 small + the mapping network (spec/ifcap.md)
BYTES_PER_PARAM = {"fp32": 4, "fp16": 2, "bf16": 2}
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
POOLS = ("retriever", "verifier", "captioner", "scorer")


def safetensors_params(path: Path) -> int:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    total = 0
    for name, t in header.items():
        if name != "__metadata__":
            count = 1
            for d in t["shape"]:
                count *= int(d)
            total += count
    return total


def local_params(spec: str | None) -> int | None:
    """Parameters in a local weights file or directory; None when ``spec`` is not a local path."""
    if not spec:
        return None
    p = Path(spec).expanduser()
    files = [p] if p.is_file() else sorted(f for f in p.iterdir() if f.suffix in WEIGHT_SUFFIXES) if p.is_dir() else None
    if files is None:
        return None
    st = [f for f in files if f.suffix == ".safetensors"]
    return sum(safetensors_params(f) for f in st) if st else sum(f.stat().st_size // 4 for f in files)


def encoder_params(encoder: Any, towers: Iterable[str] = ("image", "text")) -> int:
    towers = tuple(towers)
    known = CLIP_TOWERS.get(encoder.model)
    if known is not None:
        return sum(known[t] for t in towers)
    local = local_params(encoder.pretrained) or 0
    return local if len(towers) == 2 else local // 2


def precision_bytes(precision: str, gpu: bool) -> int:
    """"auto" is half precision on a GPU and fp32 on the CPU (as the loaders)."""
    return (2 if gpu else 4) if precision == "auto" else BYTES_PER_PARAM[precision]


def pool_budget(cfg: Any, gpu: bool | None = None) -> dict[str, dict[str, int]]:
    """``{pool: {"params", "bytes"}}`` of the four feature pools (and the corpus ``encoder``)."""
    if gpu is None:
        gpu = str(cfg.device).startswith("cuda")
    enc, ver, cap = cfg.retrieval.encoder, cfg.verifier, cfg.captioner
    eb, vb = precision_bytes(enc.precision, gpu), precision_bytes(ver.precision, gpu)
    v = 0 if not ver.enabled else (local_params(ver.model) or BLIP_ITM_LARGE)
    image, text = encoder_params(enc, ("image",)), encoder_params(enc, ("text",))
    own = local_params(cap.checkpoint) or IFCAP_PARAMS
    clip = encoder_params(cap.clip)
    return {
        "retriever": {"params": image, "bytes": image * eb},
        "verifier": {"params": v, "bytes": v * vb},
        "captioner": {"params": own + clip,
                      "bytes": own * precision_bytes(cap.precision, gpu) + clip * precision_bytes(cap.clip.precision, gpu)},
        "scorer": {"params": text + v, "bytes": text * eb + v * vb},
        "encoder": {"params": text, "bytes": text * eb},
    }

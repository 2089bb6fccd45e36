"""How much memory a model takes, estimated without loading it: the parameter counts that each model
family's ``size`` in :mod:`adjcap.engine.stage_registry` adds up, and :func:`adjcap.engine.pools.pool_budget` per pool
(the parameter count of the models a pool holds and their size in memory at the precision they run
in). Counts come from, in order:

1. a local weights file or directory (the tiny demo models, user checkpoints): a safetensors file's
   header gives the exact count; any other file counts as fp32 (file size / 4);
2. a table of the known architectures (counted once from their configs: the open_clip towers
   separately, BLIP ITM large, IFCap's GPT-2 + mapping network);
3. otherwise 0 (an unknown hub id: nothing is fetched to find out).

A dual encoder loaded with one tower counts that tower only (the scorer pool holds the retrieval
encoder's text tower; its image tower is loaded only when a state lacks the stage-1 embedding).
Pure: reads file sizes and safetensors headers, never imports a model library.
"""

from __future__ import annotations

import json
import pkgutil
import struct
from pathlib import Path
from typing import Any, Iterable

from adjcap.engine import verifier_families

# open_clip architectures: parameters per tower (counted from the open_clip configs)
CLIP_TOWERS: dict[str, dict[str, int]] = {
    "ViT-bigG-14": {"image": 1_844_907_264, "text": 694_659_841},
    "ViT-B-32": {"image": 87_849_216, "text": 63_428_097},
    "ViT-B-32-quickgelu": {"image": 87_849_216, "text": 63_428_097},
    "RN50x64": {"image": 420_380_352, "text": 202_877_953},
    "ViT-L-14": {"image": 303_966_208, "text": 123_650_305},
    "ViT-B-16": {"image": 86_192_640, "text": 63_428_097},
    # SigLIP (the clip verifier family's): open_clip's timm ViT-SO400M/14 at 384 px; text with scale and bias
    "ViT-SO400M-14-SigLIP-384": {"image": 428_225_600, "text": 449_734_898},
}
# Hugging Face BlipForImageTextRetrieval, ViT-L/16 at 384 px + BERT-base with cross-attention
BLIP_ITM_LARGE = 446_128_642
# the base model: ViT-B/16 at 384 px + the same BERT-base (counted on the meta device from its config)
BLIP_ITM_BASE = 223_744_258
BLIP_PARAMS: dict[str, int] = {
    "Salesforce/blip-itm-large-coco": BLIP_ITM_LARGE,
    "Salesforce/blip-itm-large-flickr": BLIP_ITM_LARGE,
    "Salesforce/blip-itm-base-coco": BLIP_ITM_BASE,
    "Salesforce/blip-itm-base-flickr": BLIP_ITM_BASE,
}
# Hugging Face Blip2ForImageTextRetrieval: EVA ViT-g/14 at 224 px + the BERT-base Q-Former with 32 queries and
# its text feed-forward (counted on the meta device from Blip2Config's defaults with use_qformer_text_input and
# the Q-Former vocabulary with [DEC], 30,523, as the ITM checkpoint's config)
BLIP2_PARAMS: dict[str, int] = {"Salesforce/blip2-itm-vit-g": 1_172_032_258}
# IFCap without its CLIP: GPT-2 small (124,439,808) + the mapping network (46,864,128; both counted on
# the meta device from the released layout, as IFCap's code builds it); the checkpoint file's size is used when on disk
IFCAP_PARAMS = 124_439_808 + 46_864_128

# hf captioners (BlipForConditionalGeneration, ViT-L/16 or ViT-B/16 at 384 px + the BERT-base decoder) and
# the LM judge of a candidates file, counted on the meta device from their configs
HF_CAPTIONER_PARAMS: dict[str, int] = {
    "Salesforce/blip-image-captioning-large": 446_290_492,
    "Salesforce/blip-image-captioning-base": 223_971_644,
}
# vision-language captioners (captioner.family = vlm), counted on the meta device from the checkpoints'
# config shapes (LLaVA-1.5 7B: CLIP ViT-L/14-336 + Vicuna-7B; Qwen2.5-VL 3B with tied embeddings;
# SmolVLM-256M: SigLIP-B/16-512 + SmolLM2-135M): the hub's 7.06B / 3.75B / 256M; loaded in bf16 on GPUs
VLM_PARAMS: dict[str, int] = {
    "llava-hf/llava-1.5-7b-hf": 7_063_427_072,
    "Qwen/Qwen2.5-VL-3B-Instruct": 3_754_622_976,
    "HuggingFaceTB/SmolVLM-256M-Instruct": 256_484_928,
}
CAUSAL_LM_PARAMS: dict[str, int] = {"gpt2": 124_439_808, "openai-community/gpt2": 124_439_808}

BYTES_PER_PARAM = {"fp32": 4, "fp16": 2, "bf16": 2}
_SAFETENSORS_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
                      "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt")


def safetensors_params(path: Path, keep: Any = None) -> int:
    """Parameter count from a safetensors file's JSON header (no tensor is read); ``keep(name)``
    selects tensors by name."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    total = 0
    for name, t in header.items():
        if name == "__metadata__" or (keep is not None and not keep(name)):
            continue
        count = 1
        for d in t.get("shape", []):
            count *= int(d)
        total += count
    return total


def file_params(path: Path) -> int:
    """Parameters in a weights file (safetensors: exact; other formats: size / 4, as fp32)."""
    if path.suffix == ".safetensors":
        try:
            return safetensors_params(path)
        except (OSError, ValueError, struct.error):
            pass
    return path.stat().st_size // 4


def local_params(spec: str | None) -> int | None:
    """Parameters of a local weights file, or of the weights files in a local directory; None when
    ``spec`` is not a local path."""
    if not spec:
        return None
    p = Path(spec).expanduser()
    if p.is_file():
        return file_params(p)
    if p.is_dir():
        files = [f for f in sorted(p.iterdir()) if f.is_file() and f.suffix in WEIGHT_SUFFIXES]
        st = [f for f in files if f.suffix == ".safetensors"]
        return sum(file_params(f) for f in (st or files))  # one format when a repo ships both
    return None


def encoder_params(encoder: Any, towers: Iterable[str] = ("image", "text")) -> int:
    """An open_clip encoder section (``model``, ``pretrained``): the towers asked for."""
    towers = tuple(towers)
    known = CLIP_TOWERS.get(encoder.model)
    if known is not None:
        return sum(known[t] for t in towers)
    spec = Path(encoder.pretrained).expanduser() if encoder.pretrained else None
    if spec is not None and spec.is_file() and spec.suffix == ".safetensors" and len(set(towers)) == 1:
        # open_clip names the image tower's tensors visual.*; the rest is the text tower
        image = towers[0] == "image"
        try:
            return safetensors_params(spec, lambda k: k.startswith("visual.") == image)
        except (OSError, ValueError, struct.error):
            pass
    local = local_params(encoder.pretrained)
    if local is None:
        return 0
    return local if len(set(towers)) == 2 else local // 2  # a format without names: half per tower


def verifier_params(verifier: Any) -> int:
    """The verifier section's model, by its family's record (``params``: :mod:`adjcap.engine.verifier_families`)."""
    if not verifier.enabled:
        return 0
    return pkgutil.resolve_name(verifier_families.of(verifier).params)(verifier)


def blip_itm_params(verifier: Any) -> int:
    """A BLIP ITM checkpoint: its local weights, else the table (0: unknown)."""
    local = local_params(verifier.model)
    return local if local is not None else BLIP_PARAMS.get(verifier.model, 0)


def blip2_itm_params(verifier: Any) -> int:
    """A BLIP-2 ITM checkpoint: its local weights, else the table (0: unknown)."""
    local = local_params(verifier.model)
    return local if local is not None else BLIP2_PARAMS.get(verifier.model, 0)


def captioner_params(captioner: Any) -> int:
    """IFCap (its checkpoint file when present, else the table) plus its CLIP."""
    local = local_params(captioner.checkpoint)
    own = local if local is not None else IFCAP_PARAMS
    return own + encoder_params(captioner.clip)


def hf_captioner_params(model: str) -> int:
    """A transformers captioner (``captioner.hf.model``): its local weights, else the table (0: unknown)."""
    local = local_params(model)
    return local if local is not None else HF_CAPTIONER_PARAMS.get(model, 0)


def vlm_params(model: str) -> int:
    """A vision-language captioner (``captioner.vlm.model``): its local weights, else the table (0: unknown)."""
    local = local_params(model)
    return local if local is not None else VLM_PARAMS.get(model, 0)


def causal_lm_params(model: str) -> int:
    """The LM judge (``captioner.candidates.lm``): its local weights, else the table (0: unknown)."""
    local = local_params(model)
    return local if local is not None else CAUSAL_LM_PARAMS.get(model, 0)


def precision_bytes(precision: str, gpu: bool, auto_half: bool = True) -> int:
    """Bytes per parameter at the precision a model loads in: "auto" is half precision on a GPU and
    fp32 on the CPU (the encoders' and the verifier's loaders), or fp32 everywhere for a loader whose
    "auto" keeps fp32 (``auto_half=False``: IFCap's GPT-2, whose beams are precision-sensitive)."""
    if precision == "auto":
        return 2 if gpu and auto_half else 4
    return BYTES_PER_PARAM[precision]


def corpus_encode_bytes(captions: int, shard_size: int, width: int, context: int = 77) -> int:
    """What a corpus-encoder actor holds beyond its model: the corpus ids it gets once (8 bytes a caption),
    one shard's token ids (int32 as they come, int64 on the device: 12 bytes a token) and its embeddings
    (fp32, their normalised copy and the written precision: 10 bytes a value). The captions come one shard
    at a time, with the shard's row (a few MB), or stay in the CPU tasks that tokenise them."""
    return int(8 * captions + shard_size * (12 * context + 10 * width))


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"

"""open_clip dual encoders: loading from a tag or a local file, image and text encoding.

``load_dual_encoder(model, pretrained)`` takes any open_clip architecture name and

* a pretrained tag (``ViT-bigG-14`` / ``laion2b_s39b_b160k``, ``ViT-B-32`` / ``openai``,
  ``RN50x64`` / ``openai``): weights come from the Hugging Face cache or are downloaded; with
  ``HF_HUB_OFFLINE=1`` a tag that is not cached fails at once with a message that names it;
* a local checkpoint file (``.safetensors``, ``.pt``, ``.pth``, ``.bin``) or a directory holding one
  (e.g. a downloaded hub snapshot): the image preprocessing and the QuickGELU switch are pinned from an
  ``open_clip_config.json`` beside the file when there is one, else from the architecture's known
  tags when they agree (a bare file carries neither);
* ``None``: random weights (deterministic given ``seed``), for benchmarks.

Text is tokenised with the model's own tokenizer and encoded at its real length: sequences are sorted
by length, batched, and each batch is cut to its longest sequence. With open_clip's causal text mask
and EOT (argmax) / EOS / first-token pooling the cut-off padding cannot influence the pooled token, so
the embedding is the padded one (up to float rounding); towers where that does not hold (bidirectional
text towers, CoCa's appended CLS, HF text towers, 'last' pooling) are run padded.

adjcap's own tiny architecture ``adjcap-tiny-clip`` (a config in ``adjcap/models/configs``) is
registered with open_clip on import; :func:`build_tiny_clip` saves a deterministic random one.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import open_clip
import torch
import torch.nn.functional as F
from open_clip.transformer import text_global_pool
from PIL import Image

from adjcap.models.precision import ModelUnavailableError, dtype_name, hf_offline, pick_device, pick_dtype

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
TINY_CLIP = "adjcap-tiny-clip"
CHECKPOINT_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin")
SIDECAR = "open_clip_config.json"
_PREPROCESS_KEYS = ("size", "mode", "mean", "std", "interpolation", "resize_mode", "fill_color")
_TRIM_POOLS = ("argmax", "eos", "first")

_registered = False


def register_adjcap_configs() -> None:
    """Register adjcap's model configs (``adjcap/models/configs/*.json``) with open_clip (idempotent)."""
    global _registered
    if not _registered:
        open_clip.add_model_config(CONFIG_DIR)
        _registered = True


register_adjcap_configs()


# --------------------------------------------------------------------------------------------
# Text tower access
# --------------------------------------------------------------------------------------------


@dataclass
class _TextParts:
    """The pieces of an open_clip native text tower, wherever the model class keeps them."""

    token_embedding: torch.nn.Module
    positional_embedding: torch.Tensor
    transformer: torch.nn.Module
    ln_final: torch.nn.Module
    text_projection: Any
    attn_mask: torch.Tensor | None
    pool_type: str
    eos_id: int | None
    has_cls: bool

    @property
    def trim_exact(self) -> bool:
        """Cutting padding off leaves the pooled token unchanged (causal mask, pooled token inside)."""
        return self.attn_mask is not None and not self.has_cls and self.pool_type in _TRIM_POOLS


def _text_parts(model: torch.nn.Module) -> _TextParts | None:
    text = getattr(model, "text", None)
    if text is not None and isinstance(text, open_clip.transformer.TextTransformer):
        return _TextParts(
            token_embedding=text.token_embedding,
            positional_embedding=text.positional_embedding,
            transformer=text.transformer,
            ln_final=text.ln_final,
            text_projection=text.text_projection,
            attn_mask=text.attn_mask,
            pool_type=text.pool_type,
            eos_id=getattr(text, "eos_id", None),
            has_cls=text.cls_emb is not None,
        )
    if getattr(model, "token_embedding", None) is not None and getattr(model, "transformer", None) is not None:
        return _TextParts(
            token_embedding=model.token_embedding,
            positional_embedding=model.positional_embedding,
            transformer=model.transformer,
            ln_final=model.ln_final,
            text_projection=model.text_projection,
            attn_mask=getattr(model, "attn_mask", None),
            pool_type=getattr(model, "text_pool_type", "argmax"),
            eos_id=getattr(model, "text_eos_id", None),
            has_cls=False,
        )
    return None  # HF text tower or a dropped text tower


def _drop_towers(model: torch.nn.Module, keep: set[str]) -> None:
    """Free the modules of the tower(s) not in ``keep`` (``{"image"}``, ``{"text"}`` or both)."""
    if "image" not in keep and getattr(model, "visual", None) is not None:
        model.visual = None
    if "text" not in keep:
        if getattr(model, "text", None) is not None:
            model.text = None
        for name in ("token_embedding", "transformer", "ln_final"):
            if getattr(model, name, None) is not None:
                setattr(model, name, None)
        for name in ("positional_embedding", "text_projection", "attn_mask"):
            if getattr(model, name, None) is not None:
                setattr(model, name, None)


# --------------------------------------------------------------------------------------------
# The encoder
# --------------------------------------------------------------------------------------------


@dataclass
class TokenizedTexts:
    """Token ids padded to the context length, and the real length of each sequence (the cut point)."""

    ids: torch.Tensor  # int64 [N, context]
    lengths: torch.Tensor  # int64 [N]

    def __len__(self) -> int:
        return int(self.ids.shape[0])


@dataclass
class DualEncoder:
    """An open_clip model with its tokenizer and preprocessing, on one device in one dtype."""

    model: torch.nn.Module
    model_name: str
    model_id: str
    device: torch.device
    dtype: torch.dtype
    tokenizer: Any
    preprocess_cfg: dict[str, Any]
    towers: tuple[str, ...]
    embed_dim: int
    image_batch_size: int = 32
    text_batch_size: int = 512
    _transform: Any = field(default=None, repr=False)
    _text: _TextParts | None = field(default=None, repr=False)

    # ---- identity --------------------------------------------------------------------------
    @property
    def slug(self) -> str:
        """``model_id`` made safe for a directory name."""
        return re.sub(r"[^A-Za-z0-9._-]+", "_", self.model_id).strip("_")

    @property
    def precision(self) -> str:
        return dtype_name(self.dtype)

    @property
    def context_length(self) -> int:
        return int(getattr(self.tokenizer, "context_length", None) or 77)

    @property
    def image_size(self) -> tuple[int, int]:
        size = self.preprocess_cfg["size"]
        return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))

    @property
    def text_trim_exact(self) -> bool:
        """True when encode_texts cuts padding (the embedding is provably the padded one)."""
        return self._text is not None and self._text.trim_exact

    def _need(self, tower: str) -> None:
        if tower not in self.towers:
            raise RuntimeError(
                f"{self.model_id}: the {tower} tower was not loaded (towers={self.towers}); "
                f"load it with towers=(..., '{tower}')"
            )

    # ---- images ----------------------------------------------------------------------------
    def preprocess(self, images: Sequence[Image.Image] | Image.Image) -> torch.Tensor:
        """PIL images -> float32 CPU tensor [B, 3, H, W] with this model's resize/crop/normalisation."""
        if isinstance(images, Image.Image):
            images = [images]
        if len(images) == 0:
            h, w = self.image_size
            return torch.empty(0, 3, h, w)
        return torch.stack([self._transform(im) for im in images])

    @torch.inference_mode()
    def encode_images(
        self, images: Sequence[Image.Image] | torch.Tensor, normalize: bool = True
    ) -> torch.Tensor:
        """PIL images, or a tensor already made by :meth:`preprocess`, -> float32 [B, D] on ``device``."""
        self._need("image")
        if isinstance(images, torch.Tensor):
            pixels = images
        else:
            pixels = None
            images = list(images)
        n = int(pixels.shape[0]) if pixels is not None else len(images)
        if n == 0:
            return torch.empty(0, self.embed_dim, device=self.device)
        outs = []
        for start in range(0, n, self.image_batch_size):
            if pixels is not None:
                batch = pixels[start : start + self.image_batch_size]
            else:
                batch = self.preprocess(images[start : start + self.image_batch_size])
            batch = batch.to(self.device, dtype=self.dtype, non_blocking=True)
            feats = self.model.visual(batch).float()
            outs.append(F.normalize(feats, dim=-1) if normalize else feats)
        return torch.cat(outs)

    # ---- texts -----------------------------------------------------------------------------
    def tokenize(self, texts: Sequence[str]) -> TokenizedTexts:
        """Texts -> padded ids and real lengths (the prefix that decides the pooled embedding)."""
        texts = [texts] if isinstance(texts, str) else list(texts)
        if not texts:
            return TokenizedTexts(
                torch.zeros(0, self.context_length, dtype=torch.long), torch.zeros(0, dtype=torch.long)
            )
        ids = self.tokenizer(texts)
        if not isinstance(ids, torch.Tensor):
            ids = torch.as_tensor(ids)
        return TokenizedTexts(ids.long(), self._lengths(ids.long()))

    def _lengths(self, ids: torch.Tensor) -> torch.Tensor:
        ctx = ids.shape[1]
        parts = self._text
        if parts is None or not parts.trim_exact:
            return torch.full((ids.shape[0],), ctx, dtype=torch.long)
        if parts.pool_type == "argmax":
            return ids.argmax(dim=-1) + 1
        if parts.pool_type == "eos":
            hit = ids == parts.eos_id
            first = hit.int().argmax(dim=-1)
            return torch.where(hit.any(dim=-1), first + 1, torch.full_like(first, ctx))
        return torch.ones(ids.shape[0], dtype=torch.long)  # 'first'

    @torch.inference_mode()
    def encode_tokens(
        self,
        tokens: TokenizedTexts | torch.Tensor,
        normalize: bool = True,
        trim: bool | None = None,
    ) -> torch.Tensor:
        """Token ids (e.g. cached corpus ids) -> float32 [N, D] on ``device``, in input order.

        ``trim=None`` cuts padding when that is exact for this tower, ``False`` always runs the
        full context (the reference), ``True`` insists (error when not exact).
        """
        self._need("text")
        if isinstance(tokens, torch.Tensor):
            tokens = TokenizedTexts(tokens.long(), self._lengths(tokens.long()))
        n = len(tokens)
        if n == 0:
            return torch.empty(0, self.embed_dim, device=self.device)
        exact = self.text_trim_exact
        if trim is True and not exact:
            raise ValueError(
                f"{self.model_id}: trimming text padding is not exact for this text tower "
                f"(pool={getattr(self._text, 'pool_type', 'hf')}); use trim=None or False"
            )
        do_trim = exact if trim is None else bool(trim)
        lengths = tokens.lengths if do_trim else torch.full((n,), tokens.ids.shape[1], dtype=torch.long)
        # bucket by length: stable sort, then cut every batch to its longest member
        order = torch.argsort(lengths, stable=True)
        out = torch.empty(n, self.embed_dim, dtype=torch.float32, device=self.device)
        for start in range(0, n, self.text_batch_size):
            idx = order[start : start + self.text_batch_size]
            width = int(lengths[idx].max())
            ids = tokens.ids[idx, :width].to(self.device, non_blocking=True)
            feats = self._text_forward(ids) if do_trim else self.model.encode_text(ids)
            feats = feats.float()
            out[idx.to(self.device)] = F.normalize(feats, dim=-1) if normalize else feats
        return out

    def encode_texts(self, texts: Sequence[str], normalize: bool = True, trim: bool | None = None) -> torch.Tensor:
        """Texts -> float32 [N, D] on ``device`` (unit norm unless ``normalize=False``), input order."""
        return self.encode_tokens(self.tokenize(texts), normalize=normalize, trim=trim)

    def _text_forward(self, ids: torch.Tensor) -> torch.Tensor:
        """The native open_clip text forward on a sequence shorter than the context."""
        p = self._text
        assert p is not None
        width = ids.shape[1]
        cast = p.transformer.get_cast_dtype()
        x = p.token_embedding(ids).to(cast)
        x = x + p.positional_embedding[:width].to(cast)
        mask = p.attn_mask[:width, :width] if p.attn_mask is not None else None
        x = p.transformer(x, attn_mask=mask)
        x = p.ln_final(x)
        x = text_global_pool(x, ids, p.pool_type, eos_token_id=p.eos_id)
        if p.text_projection is not None:
            if isinstance(p.text_projection, torch.nn.Linear):
                x = p.text_projection(x)
            else:
                x = x @ p.text_projection
        return x

    @property
    def logit_scale(self) -> float:
        return float(self.model.logit_scale.exp().item())


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def _file_fingerprint(path: Path) -> str:
    """sha256 of the file (files over 1 GiB: of its size, first and last 64 MiB: ``sha256s``)."""
    size = path.stat().st_size
    h = hashlib.sha256()
    chunk = 1 << 24
    with open(path, "rb") as f:
        if size <= (1 << 30):
            while True:
                buf = f.read(chunk)
                if not buf:
                    break
                h.update(buf)
            return "sha256:" + h.hexdigest()[:16]
        h.update(str(size).encode())
        h.update(f.read(64 << 20))
        f.seek(size - (64 << 20))
        h.update(f.read(64 << 20))
    return "sha256s:" + h.hexdigest()[:16]


def _find_checkpoint(dir_path: Path) -> Path | None:
    preferred = [
        "open_clip_model.safetensors",
        "open_clip_pytorch_model.safetensors",
        "open_clip_pytorch_model.bin",
        "open_clip_pytorch_model.pth",
        "model.safetensors",
        "pytorch_model.bin",
    ]
    for name in preferred:
        if (dir_path / name).is_file():
            return dir_path / name
    found = sorted(p for p in dir_path.iterdir() if p.suffix in CHECKPOINT_SUFFIXES and p.is_file())
    found.sort(key=lambda p: p.suffix != ".safetensors")
    return found[0] if found else None


def _looks_like_path(text: str) -> bool:
    return (
        os.sep in text
        or "/" in text
        or text.startswith((".", "~"))
        or text.endswith(CHECKPOINT_SUFFIXES)
    )


def tag_files(pcfg: dict[str, Any]) -> tuple[str | None, list[str], str | None]:
    """(hub repo, candidate filenames, url) of a pretrained tag, as open_clip resolves them."""
    repo, files = None, []
    hub = pcfg.get("hf_hub") or ""
    if hub:
        repo, filename = os.path.split(hub)
        if filename:
            files = [filename]
            if filename.endswith((".bin", ".pth")) and filename != "pytorch_model.bin":
                files.insert(0, filename[:-4] + ".safetensors")
        else:
            files = ["open_clip_model.safetensors", "open_clip_pytorch_model.bin"]
    return repo, files, pcfg.get("url") or None


def tag_cached(pcfg: dict[str, Any], cache_dir: str | None) -> bool:
    """Whether the weights of an open_clip pretrained config are in the HF cache or open_clip's URL cache."""
    repo, files, url = tag_files(pcfg)
    if repo:
        from huggingface_hub import try_to_load_from_cache

        for fn in files:
            got = try_to_load_from_cache(repo, fn, cache_dir=cache_dir)
            if isinstance(got, str) and os.path.isfile(got):
                return True
    if url:
        target = Path(cache_dir or os.path.expanduser("~/.cache/clip")) / os.path.basename(url)
        if target.is_file():
            return True
    return False


_tag_files = tag_files  # the old private name (tests import it)


def _unavailable_message(model: str, tag: str, pcfg: dict[str, Any], cause: str) -> str:
    repo, files, url = tag_files(pcfg)
    where = []
    if repo:
        where.append(f"Hugging Face repo '{repo}' (file {' or '.join(files)})")
    if url:
        where.append(f"URL {url}")
    return (
        f"open_clip weights for model '{model}' with pretrained tag '{tag}' are not available: {cause}. "
        f"They come from {'; '.join(where) or 'the open_clip registry'}. Either download them on a machine "
        f"with internet access (e.g. `huggingface-cli download {repo or '<repo>'}`) and copy the Hugging Face "
        f"cache here, or pass the downloaded checkpoint file (or the snapshot directory) as `pretrained` "
        f"(config key retrieval.encoder.pretrained / captioner.clip.pretrained)."
    )


def _sidecar(path: Path) -> dict[str, Any]:
    folder = path if path.is_dir() else path.parent
    side = folder / SIDECAR
    if not side.is_file():
        return {}
    try:
        data = json.loads(side.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{side}: not valid JSON ({e}); fix or remove it") from e
    if not isinstance(data, dict):
        raise ValueError(f"{side}: expected a JSON object with 'model_cfg' / 'preprocess_cfg'")
    return data


def _pinned_from_tags(model: str) -> tuple[dict[str, Any], bool | None]:
    """Preprocessing and QuickGELU shared by every known tag of ``model`` (empty/None if they differ)."""
    tags = open_clip.list_pretrained_tags_by_model(model)
    cfgs = [open_clip.get_pretrained_cfg(model, t) for t in tags]
    cfgs = [c for c in cfgs if c]
    if not cfgs:
        return {}, None
    pp: dict[str, Any] = {}
    for key in ("mean", "std", "interpolation", "resize_mode"):
        values = {json.dumps(list(c[key]) if isinstance(c.get(key), tuple) else c.get(key)) for c in cfgs}
        if len(values) == 1 and cfgs[0].get(key) is not None:
            pp[key] = cfgs[0][key]
    qg = {bool(c.get("quick_gelu", False)) for c in cfgs}
    return pp, (qg.pop() if len(qg) == 1 else None)


@dataclass
class _Source:
    """Where the weights come from and what open_clip.create_model must be told about them."""

    model_cfg: dict[str, Any]
    ckpt: str | None
    kwargs: dict[str, Any]
    force_pp: dict[str, Any]
    force_quick_gelu: bool
    model_id: str


def _resolve_source(
    model: str, pretrained: str | os.PathLike | None, *, quick_gelu: bool | None = None,
    cache_dir: str | None = None, seed: int = 0,
) -> _Source:
    """Resolve ``pretrained`` (tag, file, directory or None) without loading any weights."""
    model_cfg = open_clip.get_model_config(model)
    kwargs: dict[str, Any] = {}
    force_pp: dict[str, Any] = {}
    qg: bool | None = None
    ckpt: str | None = None
    if pretrained is None or str(pretrained) == "":
        model_id = f"{model}/random-seed{seed}"
    else:
        text = str(pretrained)
        expanded = Path(os.path.expanduser(text))
        pcfg = open_clip.get_pretrained_cfg(model, text) if not _looks_like_path(text) else {}
        if pcfg:
            # a registered tag: check the cache first when offline
            if hf_offline() and not tag_cached(pcfg, cache_dir):
                raise ModelUnavailableError(
                    _unavailable_message(model, text, pcfg, "HF_HUB_OFFLINE is set and they are not cached")
                )
            ckpt = text
            if pcfg.get("quick_gelu") and not model_cfg.get("quick_gelu", False):
                qg = True
            model_id = f"{model}/{text}"
        elif expanded.exists():
            path = expanded
            if path.is_dir():
                found = _find_checkpoint(path)
                if found is None:
                    raise FileNotFoundError(
                        f"{path}: no checkpoint (*.safetensors, *.bin, *.pt, *.pth) in this directory; "
                        f"point `pretrained` at the checkpoint file"
                    )
                path = found
            elif path.suffix not in CHECKPOINT_SUFFIXES:
                raise ValueError(
                    f"{path}: not a checkpoint file (expected {', '.join(CHECKPOINT_SUFFIXES)})"
                )
            side = _sidecar(path)
            side_model = side.get("model_cfg") or {}
            for key in ("embed_dim", "vision_cfg", "text_cfg", "quick_gelu"):
                if key in side_model and side_model[key] != model_cfg.get(key):
                    kwargs[key] = side_model[key]
            pp_tags, qg_tags = _pinned_from_tags(model)
            side_pp = {k: v for k, v in (side.get("preprocess_cfg") or {}).items() if k in _PREPROCESS_KEYS}
            if side_pp:
                force_pp = side_pp
            elif pp_tags:
                force_pp = pp_tags
            if not side_model and "quick_gelu" not in model_cfg:
                if qg_tags is None and open_clip.list_pretrained_tags_by_model(model) and quick_gelu is None:
                    warnings.warn(
                        f"{path}: the known '{model}' checkpoints differ in activation (QuickGELU or GELU) and "
                        f"this file does not say which it is; assuming GELU. For OpenAI-trained weights use "
                        f"model='{model}-quickgelu' or pass quick_gelu=True (or put {SIDECAR} beside the file)",
                        stacklevel=3,
                    )
                elif qg_tags:
                    qg = True
            ckpt = str(path)
            model_id = f"{model}/{_file_fingerprint(path)}"
        elif _looks_like_path(text):
            raise FileNotFoundError(
                f"checkpoint '{text}' for open_clip model '{model}' does not exist. Give the path of a "
                f"downloaded checkpoint (.safetensors/.pt/.bin) or one of the pretrained tags: "
                f"{', '.join(open_clip.list_pretrained_tags_by_model(model)) or '(none registered)'}"
            )
        else:
            raise ValueError(
                f"'{text}' is neither a pretrained tag of open_clip model '{model}' nor an existing file. "
                f"Known tags: {', '.join(open_clip.list_pretrained_tags_by_model(model)) or '(none)'}"
            )
    if quick_gelu is not None:
        qg = quick_gelu
    force_qg = False
    if qg is True and not kwargs.get("quick_gelu", model_cfg.get("quick_gelu", False)):
        force_qg = True  # open_clip's own switch (set before its tag/activation consistency check)
    elif qg is False:
        kwargs["quick_gelu"] = False
    return _Source(model_cfg, ckpt, kwargs, force_pp, force_qg, model_id)



@functools.lru_cache(maxsize=8)
def _tokenizer(model: str, context_length: int) -> Any:
    return open_clip.get_tokenizer(model, context_length=context_length)


def load_dual_encoder(
    model: str,
    pretrained: str | os.PathLike | None,
    *,
    device: str | torch.device = "auto",
    precision: str = "auto",
    towers: Iterable[str] = ("image", "text"),
    image_batch_size: int = 32,
    text_batch_size: int = 512,
    quick_gelu: bool | None = None,
    cache_dir: str | None = None,
    seed: int = 0,
) -> DualEncoder:
    """Load an open_clip dual encoder.

    Args:
        model: open_clip architecture name (``ViT-bigG-14``, ``ViT-B-32``, ``RN50x64``, ``adjcap-tiny-clip``).
        pretrained: a pretrained tag of that architecture, a local checkpoint file or a directory holding
            one, or ``None`` for random weights (seeded by ``seed``).
        device: "auto", "cpu", "cuda", "cuda:N".
        precision: "auto" (bf16/fp16 on GPU, fp32 on CPU), "fp32", "fp16", "bf16".
        towers: the towers to keep; the others are freed after loading.
        quick_gelu: force the QuickGELU activation on/off (default: from the tag / sidecar / tags).
        cache_dir: download cache (default: the Hugging Face cache).
    """
    register_adjcap_configs()
    keep = {t.strip().lower() for t in towers}
    bad = keep - {"image", "text"}
    if bad or not keep:
        raise ValueError(f"towers must be a non-empty subset of ('image', 'text'); got {tuple(towers)}")
    if open_clip.get_model_config(model) is None:
        import difflib

        close = difflib.get_close_matches(model, open_clip.list_models(), n=5, cutoff=0.5)
        raise ValueError(
            f"unknown open_clip model '{model}'"
            + (f"; did you mean {', '.join(close)}?" if close else "")
            + " (open_clip.list_models() lists them all)"
        )
    dev = pick_device(device)
    dtype = pick_dtype(precision, dev)

    src = _resolve_source(model, pretrained, quick_gelu=quick_gelu, cache_dir=cache_dir, seed=seed)
    model_cfg, ckpt, kwargs, force_pp, model_id = src.model_cfg, src.ckpt, src.kwargs, src.force_pp, src.model_id

    build_on = dev if dev.type == "cuda" else torch.device("cpu")
    with torch.random.fork_rng(devices=[build_on.index or 0] if build_on.type == "cuda" else []):
        torch.manual_seed(seed)
        try:
            with torch.device(build_on):
                net = open_clip.create_model(
                    model,
                    pretrained=ckpt,
                    precision="fp32",
                    device=build_on,
                    force_preprocess_cfg=force_pp or None,
                    force_quick_gelu=src.force_quick_gelu,
                    cache_dir=cache_dir,
                    weights_only=True,
                    **kwargs,
                )
        except ModelUnavailableError:
            raise
        except Exception as e:  # download or checkpoint problems: say what and how
            if ckpt is not None and not Path(os.path.expanduser(ckpt)).exists():
                pcfg = open_clip.get_pretrained_cfg(model, ckpt) or {}
                raise ModelUnavailableError(_unavailable_message(model, ckpt, pcfg, str(e))) from e
            if ckpt is not None:
                raise RuntimeError(
                    f"could not load checkpoint {ckpt} into open_clip model '{model}': {e}. Check that the file "
                    f"belongs to this architecture (and was saved with state-dict weights)"
                ) from e
            raise
    pp_cfg = dict(open_clip.get_model_preprocess_cfg(net))
    _drop_towers(net, keep)
    net = net.to(device=dev, dtype=dtype).eval()
    for p in net.parameters():
        p.requires_grad_(False)

    ctx = (kwargs.get("text_cfg") or model_cfg["text_cfg"]).get("context_length", 77)
    tokenizer = _tokenizer(model, int(ctx))
    from open_clip.transform import PreprocessCfg, image_transform_v2

    transform = image_transform_v2(
        PreprocessCfg(**{k: v for k, v in pp_cfg.items() if k in _PREPROCESS_KEYS}), is_train=False
    )
    embed_dim = int(kwargs.get("embed_dim", model_cfg["embed_dim"]))
    enc = DualEncoder(
        model=net,
        model_name=model,
        model_id=model_id,
        device=dev,
        dtype=dtype,
        tokenizer=tokenizer,
        preprocess_cfg=pp_cfg,
        towers=tuple(t for t in ("image", "text") if t in keep),
        embed_dim=embed_dim,
        image_batch_size=int(image_batch_size),
        text_batch_size=int(text_batch_size),
        _transform=transform,
        _text=_text_parts(net) if "text" in keep else None,
    )
    return enc


def load_encoder_from_config(cfg: Any, *, towers: Iterable[str] = ("image", "text"), device: str = "auto",
                             resolve: Any = None) -> DualEncoder:
    """Load from an ``EncoderCfg`` (``model``, ``pretrained``, ``precision``, batch sizes).

    ``resolve`` expands ``{cache}``/``{data}`` in ``pretrained`` (pass ``Config.resolve``).
    """
    pretrained = cfg.pretrained
    if resolve is not None and pretrained is not None:
        pretrained = resolve(pretrained)
    return load_dual_encoder(
        cfg.model,
        pretrained,
        device=device,
        precision=cfg.precision,
        towers=towers,
        image_batch_size=cfg.image_batch_size,
        text_batch_size=cfg.text_batch_size,
    )


# --------------------------------------------------------------------------------------------
# Tiny model
# --------------------------------------------------------------------------------------------


def build_tiny_clip(path: str | os.PathLike, seed: int = 42, embed_dim: int | None = None,
                    model: str = TINY_CLIP) -> Path:
    """Save a deterministic random ``adjcap-tiny-clip`` as safetensors at ``path``.

    An ``open_clip_config.json`` (model config + preprocessing) is written beside it, so
    ``load_dual_encoder("adjcap-tiny-clip", str(path))`` rebuilds exactly this model (also with a
    non-default ``embed_dim``). Returns ``path``.
    """
    from safetensors.torch import save

    from adjcap.io import atomic_write_bytes, atomic_write_json

    register_adjcap_configs()
    path = Path(path)
    if path.suffix != ".safetensors":
        raise ValueError(f"{path}: the tiny CLIP is saved as safetensors; give a *.safetensors path")
    model_cfg = open_clip.get_model_config(model)
    if model_cfg is None:
        raise ValueError(f"unknown open_clip model '{model}'")
    kwargs = {}
    if embed_dim is not None and embed_dim != model_cfg["embed_dim"]:
        kwargs["embed_dim"] = int(embed_dim)
        model_cfg["embed_dim"] = int(embed_dim)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = open_clip.create_model(model, pretrained=None, precision="fp32", device="cpu", **kwargs)
    state = {k: v.detach().contiguous().clone() for k, v in net.state_dict().items()}
    atomic_write_bytes(path, save(state, metadata={"adjcap": json.dumps({"model": model, "seed": seed})}))
    pp = dict(open_clip.get_model_preprocess_cfg(net))
    pp = {k: (list(v) if isinstance(v, tuple) else v) for k, v in pp.items() if k in _PREPROCESS_KEYS}
    atomic_write_json(path.parent / SIDECAR, {"model_name": model, "model_cfg": model_cfg, "preprocess_cfg": pp})
    return path


def random_images(n: int, size: int = 64, seed: int = 0) -> list[Image.Image]:
    """Deterministic random RGB images (tests and benchmarks)."""
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)) for _ in range(n)]

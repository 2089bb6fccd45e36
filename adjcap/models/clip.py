"""open_clip dual encoders: loading (through :func:`adjcap.models.sources.clip_source`), image and
text encoding.

``load_dual_encoder(model, pretrained)`` takes any open_clip architecture name and a pretrained tag
(``ViT-bigG-14`` / ``laion2b_s39b_b160k``, ``ViT-B-32`` / ``openai``, ``RN50x64`` / ``openai``), an
``hf-hub:`` repo, a local checkpoint file or a directory holding one (e.g. a downloaded hub snapshot,
loaded by open_clip's own ``local-dir:`` loading when an ``open_clip_config.json`` is beside it), or
``None`` for random weights (deterministic given ``seed``); see :mod:`adjcap.models.sources`.

Text is tokenised with the model's own tokenizer and encoded at its real length: sequences are sorted
by length, batched, and each batch is cut to its longest sequence. With open_clip's causal text mask
and EOT (argmax) / EOS / first-token pooling the cut-off padding cannot influence the pooled token, so
the embedding is the padded one (up to float rounding); towers where that does not hold (bidirectional
text towers, CoCa's appended CLS, HF text towers, 'last' pooling) are run padded.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import open_clip
import torch
import torch.nn.functional as F
from open_clip.transform import PreprocessCfg, image_transform_v2
from open_clip.transformer import text_global_pool
from PIL import Image

from adjcap.config import EncoderCfg
from adjcap.models.clip_tokens import fast_tokenizer
from adjcap.models.pixels import Pixels, count, input_batches, to_device
from adjcap.engine.pixel_prep import PixelPrep
from adjcap.models.precision import dtype_name, pick_device, pick_dtype
from adjcap.models.sources import (PREPROCESS_KEYS, ModelUnavailableError, clip_source, tag_preprocess,
                                   tag_unavailable)

log = logging.getLogger(__name__)

TRIM_POOLS = ("argmax", "eos", "first")


# --------------------------------------------------------------------------------------------
# Text tower access
# --------------------------------------------------------------------------------------------


@dataclass
class TextParts:
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
        return self.attn_mask is not None and not self.has_cls and self.pool_type in TRIM_POOLS


def text_parts(model: torch.nn.Module) -> TextParts | None:
    text = getattr(model, "text", None)
    if text is not None and isinstance(text, open_clip.transformer.TextTransformer):
        return TextParts(
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
        return TextParts(
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


def text_batches(lengths: torch.Tensor, batch_size: int, token_budget: int | None = None) -> list[torch.Tensor]:
    """Indices of the text batches: sorted by length (stable), cut at ``batch_size`` rows and, with a
    ``token_budget``, before a batch's padded tokens (rows x its longest length) would exceed it
    (a single longer sequence still gets a batch). The caller writes results back by index, so
    they come out in the original order."""
    order = torch.argsort(lengths, stable=True)
    n = len(order)
    if token_budget is None:
        return [order[s : s + batch_size] for s in range(0, n, batch_size)]
    lens = lengths[order].tolist()
    out, start = [], 0
    for i in range(n):
        rows = i - start + 1
        if i > start and (rows > batch_size or rows * lens[i] > token_budget):
            out.append(order[start:i])
            start = i
    if start < n:
        out.append(order[start:])
    return out


def padded_token_fraction(counts: Sequence[int]) -> float:
    """Share of the text tower's tokens that were padding, from ``[real, padded]`` token counts."""
    real, padded = counts
    return 1.0 - real / padded if padded else 0.0


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
    text_token_budget: int | None = None  # padded tokens per text batch (None: text_batch_size rows only)
    # [real tokens, padded tokens] over every encode_tokens call (padded_token_fraction)
    text_token_counts: list[int] = field(default_factory=lambda: [0, 0], repr=False)
    _transform: Any = field(default=None, repr=False)
    _text: TextParts | None = field(default=None, repr=False)

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
    def text_tower(self) -> TextParts | None:
        """The native open_clip text tower's parts (None for HF text towers or a dropped text tower)."""
        return self._text

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
    @property
    def pixel_prep(self) -> PixelPrep | None:
        """This model's transform split in its CPU and device halves (:mod:`adjcap.engine.pixel_prep`)."""
        return PixelPrep.from_open_clip(self.preprocess_cfg)

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
        self, images: Sequence[Image.Image] | torch.Tensor | Pixels, normalize: bool = True
    ) -> torch.Tensor:
        """PIL images, a tensor already made by :meth:`preprocess`, or :class:`adjcap.models.pixels.Pixels`
        of this model's :attr:`pixel_prep` -> float32 [B, D] on ``device``."""
        self._need("image")
        images = images if isinstance(images, (torch.Tensor, Pixels)) else list(images)
        if count(images) == 0:
            return torch.empty(0, self.embed_dim, device=self.device)
        outs = []
        for batch in input_batches(images, self.image_batch_size, prep=self.pixel_prep, device=self.device,
                                   name=self.model_id, preprocess=self.preprocess):
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
        out = torch.empty(n, self.embed_dim, dtype=torch.float32, device=self.device)
        for idx in text_batches(lengths, self.text_batch_size, self.text_token_budget):
            width = int(lengths[idx].max())
            self.text_token_counts[0] += int(tokens.lengths[idx].sum())
            self.text_token_counts[1] += width * len(idx)
            ids = to_device(tokens.ids[idx, :width], self.device)
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


@functools.lru_cache(maxsize=8)
def _tokenizer(model: str) -> Any:
    """open_clip's tokenizer of an architecture name or a ``local-dir:`` / ``hf-hub:`` source, made fast with
    the same ids (:mod:`adjcap.models.clip_tokens`)."""
    return fast_tokenizer(open_clip.get_tokenizer(model))


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
        model: open_clip architecture name (``ViT-bigG-14``, ``ViT-B-32``, ``RN50x64``).
        pretrained: a pretrained tag of that architecture, ``hf-hub:REPO``, a local checkpoint file or a
            directory holding one, or ``None`` for random weights (seeded by ``seed``).
        device: "auto", "cpu", "cuda", "cuda:N".
        precision: "auto" (bf16/fp16 on GPU, fp32 on CPU), "fp32", "fp16", "bf16".
        towers: the towers to keep; the others are freed after loading.
        quick_gelu: force the QuickGELU activation on/off (default: from the tag / sidecar / tags).
        cache_dir: download cache (default: the Hugging Face cache).
    """
    keep = {t.strip().lower() for t in towers}
    if keep - {"image", "text"} or not keep:
        raise ValueError(f"towers must be a non-empty subset of ('image', 'text'); got {tuple(towers)}")
    dev = pick_device(device)
    dtype = pick_dtype(precision, dev)
    src = clip_source(model, pretrained, quick_gelu=quick_gelu, cache_dir=cache_dir, seed=seed)

    lean = _build_towers(src, keep, dtype, dev)
    if lean is not None:
        net, pp_cfg = lean
    else:
        net, pp_cfg = _build_whole(src, model, keep, dtype, dev, cache_dir, seed)
    net = net.eval()
    for p in net.parameters():
        p.requires_grad_(False)
    transform = image_transform_v2(
        PreprocessCfg(**{k: v for k, v in pp_cfg.items() if k in PREPROCESS_KEYS}), is_train=False
    )
    enc = DualEncoder(
        model=net,
        model_name=model,
        model_id=src.model_id,
        device=dev,
        dtype=dtype,
        tokenizer=_tokenizer(src.model),
        preprocess_cfg=pp_cfg,
        towers=tuple(t for t in ("image", "text") if t in keep),
        embed_dim=int(src.model_cfg["embed_dim"]),
        image_batch_size=int(image_batch_size),
        text_batch_size=int(text_batch_size),
        _transform=transform,
        _text=text_parts(net) if "text" in keep else None,
    )
    return enc


def _build_whole(src, model: str, keep: set[str], dtype: torch.dtype, dev: torch.device, cache_dir, seed: int):
    """open_clip builds the whole model in fp32 and loads the weights; the other tower is freed after."""
    build_on = dev if dev.type == "cuda" else torch.device("cpu")
    with torch.random.fork_rng(devices=[build_on.index or 0] if build_on.type == "cuda" else []):
        torch.manual_seed(seed)
        try:
            with torch.device(build_on):
                net = open_clip.create_model(
                    src.model,
                    pretrained=src.pretrained,
                    precision="fp32",
                    device=build_on,
                    force_preprocess_cfg=src.force_preprocess or None,
                    force_quick_gelu=src.force_quick_gelu,
                    cache_dir=cache_dir,
                    weights_only=True,
                    **({"quick_gelu": False} if src.quick_gelu_off else {}),
                )
        except Exception as e:  # download or checkpoint problems: say what and how
            if src.checkpoint is not None:
                raise RuntimeError(
                    f"could not load checkpoint {src.checkpoint} into open_clip model '{model}': {e}. Check that "
                    f"the file belongs to this architecture (and was saved with state-dict weights)"
                ) from e
            if src.pretrained is not None:
                pcfg = open_clip.get_pretrained_cfg(model, src.pretrained) or {}
                raise tag_unavailable(model, src.pretrained, pcfg, str(e)) from e
            if src.model.startswith("hf-hub:"):
                raise ModelUnavailableError(f"open_clip model '{src.model}' could not be loaded: {e}") from e
            raise
    pp_cfg = dict(open_clip.get_model_preprocess_cfg(net))
    _drop_towers(net, keep)
    return net.to(device=dev, dtype=dtype), pp_cfg


def _checkpoint_reader(path) -> tuple[dict[str, tuple[int, ...]], Any] | None:
    """(name -> shape, name -> tensor) of a checkpoint file, reading tensors only when asked
    (safetensors, or a zip-format torch file memory-mapped); None for other formats (e.g. OpenAI's
    TorchScript archives). Names as open_clip reads them: a ``state_dict`` wrapper and a ``module.``
    prefix are removed."""
    if str(path).endswith(".safetensors"):
        from safetensors import safe_open

        f = safe_open(str(path), framework="pt", device="cpu")
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}, f.get_tensor
    try:
        sd = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - not a zip-format state dict: open_clip's own loading decides
        return None
    if isinstance(sd, dict) and isinstance(sd.get("state_dict"), dict):
        sd = sd["state_dict"]
    if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
        return None
    if sd and next(iter(sd)).startswith("module."):
        sd = {k[len("module."):]: v for k, v in sd.items()}
    return {k: tuple(v.shape) for k, v in sd.items()}, sd.__getitem__


class _DropRandomInitWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("No pretrained weights loaded")


@contextlib.contextmanager
def quiet_random_init() -> Iterator[None]:
    """open_clip warns that the model is randomly initialised; here the weights follow from the file."""
    f = _DropRandomInitWarning()
    logging.getLogger().addFilter(f)
    try:
        yield
    finally:
        logging.getLogger().removeFilter(f)


def _build_towers(src, keep: set[str], dtype: torch.dtype, dev: torch.device):
    """Only the kept towers, allocated once in ``dtype`` on ``dev`` and filled tensor by tensor from a
    local checkpoint file: peak memory is the kept towers (bigG's image tower in bf16: 3.4 GiB, instead
    of the whole model in fp32 plus the file: 15 GiB). Returns (model, preprocess cfg), or None when
    the checkpoint is not a plain open_clip state dict of this architecture (then open_clip loads it,
    converting what it must)."""
    if src.checkpoint is None or src.model.startswith(("local-dir:", "hf-hub:")) or src.pretrained is None:
        return None
    reader = _checkpoint_reader(src.checkpoint)
    if reader is None:
        return None
    shapes, get = reader
    with torch.device("meta"), quiet_random_init():
        net = open_clip.create_model(
            src.model, pretrained=None, precision="fp32", device="meta",
            force_preprocess_cfg=src.force_preprocess or None, force_quick_gelu=src.force_quick_gelu,
            **({"quick_gelu": False} if src.quick_gelu_off else {}),
        )
    full = {k: tuple(v.shape) for k, v in net.state_dict().items()}
    pp_cfg = dict(open_clip.get_model_preprocess_cfg(net))
    _drop_towers(net, keep)
    kept = net.state_dict(keep_vars=True)
    transient = [n for n, _ in net.named_buffers() if n not in kept]
    def same_shape(k: str) -> bool:  # open_clip reshapes a scalar logit scale / bias itself
        return shapes[k] == full[k] or k in ("logit_scale", "logit_bias") and math.prod(shapes[k]) == math.prod(full[k])

    if (not set(shapes) <= set(full) or not set(kept) <= set(shapes) or not all(same_shape(k) for k in kept)
            or any(n.rsplit(".", 1)[-1] != "attn_mask" for n in transient)):
        return None
    net = net.to(dtype=dtype).to_empty(device=dev)
    with torch.no_grad():
        for k, t in net.state_dict(keep_vars=True).items():
            t.copy_(get(k).reshape(t.shape))
        for n, buf in net.named_buffers():
            if n in transient:  # open_clip's causal text mask (not saved in checkpoints)
                buf.copy_(torch.full(buf.shape, float("-inf"), device=dev).triu_(1))
    return net, pp_cfg


def tokenizer_for(cfg: EncoderCfg) -> Any:
    """The tokenizer :func:`load_encoder_from_config`'s encoder tokenises with, without loading any weights
    (the corpus encode tokenises in CPU tasks: :func:`adjcap.index.lifecycle.tokenize_range`)."""
    return _tokenizer(clip_source(cfg.model, None if cfg.pretrained in (None, "") else str(cfg.pretrained)).model)


def load_encoder_from_config(cfg: EncoderCfg, *, towers: Iterable[str] = ("image", "text"),
                             device: str = "auto") -> DualEncoder:
    """Load from a resolved ``EncoderCfg`` (``model``, ``pretrained``, ``precision``, batch sizes, the
    text tower's token budget)."""
    enc = load_dual_encoder(
        cfg.model,
        cfg.pretrained,
        device=device,
        precision=cfg.precision,
        towers=towers,
        image_batch_size=cfg.image_batch_size,
        text_batch_size=cfg.text_batch_size,
    )
    enc.text_token_budget = cfg.text_token_budget or None
    return enc


def pixel_prep_for(cfg: EncoderCfg) -> PixelPrep | None:
    """The :attr:`DualEncoder.pixel_prep` that :func:`load_encoder_from_config` would give, without
    loading any weights (the model built on the meta device, with the preprocessing its tag or
    checkpoint sets): what the job's decode tasks prepare (:mod:`adjcap.engine.pixel_prep`). None when it
    cannot be known here (the job then hands the pools the image's bytes, as before)."""
    try:
        return _pixel_prep(cfg.model, None if cfg.pretrained in (None, "") else str(cfg.pretrained))
    except Exception as e:  # noqa: BLE001 - an unknown here is not an error: the pools decode themselves
        log.info(f"pixels: the preprocessing of {cfg.model} is not known before loading ({e})")
        return None


@functools.lru_cache(maxsize=32)
def _pixel_prep(model: str, pretrained: str | None) -> PixelPrep | None:
    src = clip_source(model, pretrained)
    force = dict(src.force_preprocess or {})
    if not force and src.pretrained is not None and src.checkpoint is None:  # a tag open_clip loads itself
        force = tag_preprocess(open_clip.get_pretrained_cfg(src.model, src.pretrained) or {})
    with torch.device("meta"), quiet_random_init():
        net = open_clip.create_model(
            src.model, pretrained=None, precision="fp32", device="meta", load_weights=False,
            force_preprocess_cfg=force or None,
            force_quick_gelu=src.force_quick_gelu, **({"quick_gelu": False} if src.quick_gelu_off else {}),
        )
    return PixelPrep.from_open_clip(open_clip.get_model_preprocess_cfg(net))

"""The BLIP ITM verifier (transformers ``BlipForImageTextRetrieval``), one image against many captions.

``load_verifier("Salesforce/blip-itm-large-coco")`` (or ``...-flickr``, or a local save_pretrained
directory) returns a :class:`Verifier`:

* :meth:`Verifier.encode_images` runs the ViT once per image and precomputes, for every text layer,
  the cross-attention keys and values of the image tokens (an :class:`ImageMemo`);
* :meth:`Verifier.score` scores any number of captions per image against the memo: only the text
  side runs, on captions trimmed to their real length and bucketed by length;
* :meth:`Verifier.score_pairs` is the plain per-pair ``model(input_ids, pixel_values,
  use_itm_head=True)`` forward (image re-encoded for every pair): the reference the fast path is
  tested against.

The score is the ITM softmax match probability (class 1), in (0, 1). What BLIP's judge shares with
BLIP-2's (:mod:`adjcap.models.blip2`) is :class:`ItmJudge` (text, images in batches, the per-pair
reference) and :func:`from_hub_or_dir` (loading); each keeps its own memo and ITM forward.

Text handling follows LAVIS ``blip_image_text_matching`` (whose weights these are): captions are
cleaned by LAVIS's ``pre_caption`` (lower case, ``.!"()*#:;~`` removed, at most 50 words) when
``caption_preprocess="lavis"``, tokenised with truncation at ``max_text_tokens`` = 35 (special tokens
included), and the first token ([CLS]) is replaced by [ENC] for ITM as LAVIS does
(``first_token="enc"``; ``"cls"`` keeps [CLS] as the transformers example does). Checkpoints whose
tokenizer lacks an [ENC] entry use LAVIS's id for it: the last row of the text embedding, right
after [DEC] (BERT's 30522 tokens + [DEC] 30522 + [ENC] 30523).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image

from adjcap.config import VerifierCfg
from adjcap.models.pixels import Pixels, count, input_batches
from adjcap.models.precision import dtype_name, pick_device, pick_dtype
from adjcap.models.sources import ModelUnavailableError, hf_offline, hub_or_dir
from adjcap.engine.pixel_prep import PixelPrep

DEFAULT_VERIFIER = "Salesforce/blip-itm-large-coco"
FLICKR_VERIFIER = "Salesforce/blip-itm-large-flickr"
LAVIS_MAX_WORDS = 50


def lavis_pre_caption(caption: str, max_words: int = LAVIS_MAX_WORDS) -> str:
    """LAVIS ``BlipCaptionProcessor`` eval cleaning: lower case, drop ``.!"()*#:;~``, squeeze spaces,
    keep the first ``max_words`` words."""
    caption = re.sub(r"([.!\"()*#:;~])", " ", caption.lower())
    caption = re.sub(r"\s{2,}", " ", caption)
    caption = caption.rstrip("\n").strip(" ")
    words = caption.split(" ")
    if len(words) > max_words:
        caption = " ".join(words[:max_words])
    return caption


def pad_token_ids(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Unpadded token id lists -> (ids, attention mask) [N, longest], padded with ``pad_id`` on the right."""
    width = max(1, max(len(s) for s in seqs))
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
        mask[i, : len(s)] = 1
    return ids, mask


@dataclass
class ImageMemo:
    """Per-image state reused by every caption: ViT output and per-layer cross-attention K/V."""

    image_embeds: torch.Tensor  # [n, P, Dv]
    cross_kv: list[tuple[torch.Tensor, torch.Tensor]]  # per text layer: K, V [n, heads, P, dh]

    def __len__(self) -> int:
        return int(self.image_embeds.shape[0])

    def select(self, index: Sequence[int] | torch.Tensor) -> ImageMemo:
        idx = torch.as_tensor(index, dtype=torch.long, device=self.image_embeds.device)
        return ImageMemo(
            self.image_embeds.index_select(0, idx),
            [(k.index_select(0, idx), v.index_select(0, idx)) for k, v in self.cross_kv],
        )

    @staticmethod
    def concat(memos: Sequence[ImageMemo]) -> ImageMemo:
        return ImageMemo(
            torch.cat([m.image_embeds for m in memos]),
            [
                (torch.cat([m.cross_kv[i][0] for m in memos]), torch.cat([m.cross_kv[i][1] for m in memos]))
                for i in range(len(memos[0].cross_kv))
            ],
        )


class ItmJudge:
    """What the ITM judges of the BLIP family (BLIP's :class:`Verifier`, BLIP-2's
    :class:`adjcap.models.blip2.Blip2Verifier`) share: a model with its tokenizer and image transform on
    one device in one dtype; LAVIS's caption cleaning, tokenising truncated at ``max_text_tokens`` (the
    first token replaced by ``first_token_id`` where a family sets one), images in batches through the
    vision encoder (:meth:`_encode_batch`, :meth:`_memo`) and the per-pair reference forward
    (:meth:`_pair_logits`, ITM class 1's softmax)."""

    backend = "transformers"
    first_token_id: int | None = None  # BLIP's [ENC] (or [CLS]); None: the tokenizer's own first token

    def __init__(self, model: Any, tokenizer: Any, image_processor: Any, *, model_id: str, device: torch.device,
                 dtype: torch.dtype, max_text_tokens: int = 35, caption_preprocess: str = "lavis",
                 image_batch_size: int = 16, pair_batch_size: int = 256) -> None:
        if caption_preprocess not in ("lavis", "none"):
            raise ValueError(f"caption_preprocess must be 'lavis' or 'none'; got {caption_preprocess!r}")
        self.model = model
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.model_id = model_id
        self.device = device
        self.dtype = dtype
        self.max_text_tokens = int(max_text_tokens)
        self.caption_preprocess = caption_preprocess
        self.image_batch_size = int(image_batch_size)
        self.pair_batch_size = int(pair_batch_size)

    # ---- identity ----------------------------------------------------------------------------
    @property
    def precision(self) -> str:
        return dtype_name(self.dtype)

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9._-]+", "_", self.model_id).strip("_")

    # ---- text --------------------------------------------------------------------------------
    def clean(self, text: str) -> str:
        return lavis_pre_caption(text) if self.caption_preprocess == "lavis" else text

    def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
        """Captions -> token ids ([ENC]/[CLS] ... [SEP]), truncated at ``max_text_tokens``, unpadded."""
        if not texts:
            return []
        enc = self.tokenizer([self.clean(t) for t in texts], truncation=True, max_length=self.max_text_tokens,
                             padding=False, add_special_tokens=True)["input_ids"]
        out = [list(ids) for ids in enc]
        if self.first_token_id is not None:
            for ids in out:
                ids[0] = self.first_token_id
        return out

    def pad(self, seqs: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        return pad_token_ids(seqs, self.pad_id)

    # ---- images ------------------------------------------------------------------------------
    @property
    def pixel_prep(self) -> PixelPrep | None:
        """The image transform split in its CPU and device halves (None: a processor it cannot split)."""
        return getattr(self.image_processor, "pixel_prep", None)

    def preprocess(self, images: Sequence[Image.Image] | Image.Image) -> torch.Tensor:
        """PIL images -> pixel_values float32 [B, 3, S, S] (the checkpoint's image processor)."""
        if isinstance(images, Image.Image):
            images = [images]
        images = [im.convert("RGB") if im.mode != "RGB" else im for im in images]
        return self.image_processor(images=images, return_tensors="pt")["pixel_values"].float()

    @torch.inference_mode()
    def encode_images(self, images: Sequence[Image.Image] | torch.Tensor):
        """The vision encoder once per image (PIL images, preprocessed pixels or :class:`Pixels`): the
        memo every caption of the image is scored against."""
        images = images if isinstance(images, (torch.Tensor, Pixels)) else list(images)
        if count(images) == 0:
            raise ValueError("encode_images needs at least one image")
        return self._memo([self._encode_batch(batch) for batch in input_batches(
            images, self.image_batch_size, prep=self.pixel_prep, device=self.device, name=self.model_id,
            preprocess=self.preprocess)])

    def _encode_batch(self, batch: torch.Tensor) -> Any:
        raise NotImplementedError

    def _memo(self, parts: list[Any]) -> Any:
        raise NotImplementedError

    def score_images(self, images: Sequence[Image.Image], texts_per_image: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """encode_images + score in one call."""
        return self.score(self.encode_images(images), texts_per_image)

    @torch.inference_mode()
    def score_pairs(self, images: Sequence[Image.Image] | torch.Tensor, texts: Sequence[str],
                    batch_size: int = 16) -> np.ndarray:
        """Reference: the model's own ITM forward for each (image, text) pair (the image is re-encoded per
        pair), class 1's softmax. ``images[i]`` goes with ``texts[i]``."""
        n = int(images.shape[0]) if isinstance(images, torch.Tensor) else len(images)
        if n != len(texts):
            raise ValueError(f"score_pairs: {n} images for {len(texts)} texts")
        seqs = self.tokenize(list(texts))
        out = np.zeros(n, dtype=np.float32)
        for start in range(0, n, batch_size):
            sl = slice(start, start + batch_size)
            pix = images[sl] if isinstance(images, torch.Tensor) else self.preprocess(list(images[sl]))
            ids, mask = self.pad(seqs[sl])
            logits = self._pair_logits(pix.to(self.device, dtype=self.dtype), ids, mask)
            out[sl] = logits.float().softmax(dim=-1)[:, 1].cpu().numpy()
        return out

    def _pair_logits(self, pixels: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class Verifier(ItmJudge):
    """A BLIP ITM model with its tokenizer and image processor on one device in one dtype."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        image_processor: Any,
        *,
        model_id: str,
        device: torch.device,
        dtype: torch.dtype,
        max_text_tokens: int = 35,
        first_token: str = "enc",
        caption_preprocess: str = "lavis",
        image_batch_size: int = 16,
        pair_batch_size: int = 256,
        text_token_budget: int | None = None,
    ) -> None:
        if first_token not in ("enc", "cls"):
            raise ValueError(f"first_token must be 'enc' or 'cls'; got {first_token!r}")
        super().__init__(model, tokenizer, image_processor, model_id=model_id, device=device, dtype=dtype,
                         max_text_tokens=max_text_tokens, caption_preprocess=caption_preprocess,
                         image_batch_size=image_batch_size, pair_batch_size=pair_batch_size)
        self.first_token = first_token
        # padded tokens per ITM chunk (None: pair_batch_size rows only); [real, padded] tokens scored so far
        self.text_token_budget = text_token_budget or None
        self.text_token_counts = [0, 0]
        text_cfg = model.config.text_config
        self.pad_id = int(text_cfg.pad_token_id if text_cfg.pad_token_id is not None else 0)
        self.first_token_id = self._resolve_first_token()
        self.text_layers = model.text_encoder.encoder.layer
        self.heads = int(text_cfg.num_attention_heads)
        self.head_dim = int(text_cfg.hidden_size) // self.heads

    def _resolve_first_token(self) -> int:
        tok = self.tokenizer
        if self.first_token == "cls":
            return int(tok.cls_token_id)
        vocab = tok.get_vocab()
        if "[ENC]" in vocab:
            return int(vocab["[ENC]"])
        text_cfg = self.model.config.text_config
        vocab_size = int(text_cfg.vocab_size)
        bos = text_cfg.bos_token_id
        if bos is not None and int(bos) == vocab_size - 2 and len(tok) <= vocab_size - 1:
            return vocab_size - 1  # LAVIS: [DEC] = len(bert vocab), [ENC] = next
        raise ValueError(
            f"{self.model_id}: the tokenizer has no [ENC] token and the text embedding does not have the "
            "LAVIS layout ([DEC], [ENC] after the BERT vocabulary); use first_token='cls' "
            "(config verifier.itm_first_token)"
        )

    # ---- images ------------------------------------------------------------------------------
    def _encode_batch(self, batch: torch.Tensor) -> ImageMemo:
        """The ViT's output and every text layer's cross-attention keys/values of the image tokens."""
        embeds = self.model.vision_model(pixel_values=batch.to(self.device, dtype=self.dtype)).last_hidden_state
        return self.memo_from_image_embeds(embeds)

    def _memo(self, parts: list[ImageMemo]) -> ImageMemo:
        return parts[0] if len(parts) == 1 else ImageMemo.concat(parts)

    @torch.inference_mode()
    def memo_from_image_embeds(self, embeds: torch.Tensor) -> ImageMemo:
        """An ImageMemo from vision-encoder outputs [n, P, Dv] computed earlier (e.g. in another
        pool): only the per-layer cross-attention keys/values are computed here."""
        embeds = embeds.to(self.device, dtype=self.dtype)
        kv = []
        for layer in self.text_layers:
            att = layer.crossattention.self
            k = att.key(embeds).view(embeds.shape[0], embeds.shape[1], self.heads, self.head_dim)
            v = att.value(embeds).view(embeds.shape[0], embeds.shape[1], self.heads, self.head_dim)
            kv.append((k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()))
        return ImageMemo(embeds, kv)

    # ---- scoring -----------------------------------------------------------------------------
    @torch.inference_mode()
    def score(self, memo: ImageMemo, texts_per_image: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """ITM match probabilities: one float32 array per image, one value per caption, in order."""
        if len(texts_per_image) != len(memo):
            raise ValueError(
                f"score: {len(texts_per_image)} caption lists for {len(memo)} encoded images"
            )
        counts = [len(texts) for texts in texts_per_image]
        seqs = self.tokenize([t for texts in texts_per_image for t in texts])
        # filled on the device chunk by chunk, read back once (a read per chunk would stall a GPU per chunk)
        probs = torch.zeros(len(seqs), dtype=torch.float32, device=self.device)
        starts = np.concatenate([[0], np.cumsum(counts)]).astype(int)
        # images with captions, shortest longest-caption first: a chunk of whole images is padded to
        # its longest caption, and similar lengths share a chunk (bucketing by length)
        longest = {i: max(len(seqs[j]) for j in range(starts[i], starts[i + 1])) for i in range(len(memo)) if counts[i]}
        order = sorted(longest, key=lambda i: longest[i])
        budget = self.text_token_budget
        chunk: list[int] = []
        for i in order:
            width = max([counts[c] for c in chunk] + [counts[i]])
            rows = (len(chunk) + 1) * width
            # with a token budget, also cut before rows x the longest caption (image i's: in order) exceeds it
            if chunk and (rows > self.pair_batch_size or (budget is not None and rows * longest[i] > budget)):
                self._score_chunk(chunk, counts, starts, seqs, memo, probs)
                chunk = []
            chunk.append(i)
        if chunk:
            self._score_chunk(chunk, counts, starts, seqs, memo, probs)
        host = probs.cpu().numpy() if len(seqs) else np.zeros(0, dtype=np.float32)
        return [host[starts[i] : starts[i + 1]].copy() for i in range(len(memo))]

    def _score_chunk(self, chunk: list[int], counts: list[int], starts: np.ndarray, seqs: list[list[int]],
                     memo: ImageMemo, probs: torch.Tensor) -> None:
        """Score every caption of the images in ``chunk``: rows are laid out image-major, each image
        padded to the same caption count (dummy rows are fully masked and dropped)."""
        per = max(counts[i] for i in chunk)
        rows: list[list[int]] = []
        dest: list[int] = []
        for i in chunk:
            for j in range(starts[i], starts[i + 1]):
                rows.append(seqs[j])
                dest.append(j)
            for _ in range(per - counts[i]):
                rows.append([])
                dest.append(-1)
        ids, mask = self.pad(rows)
        self.text_token_counts[0] += sum(len(r) for r in rows)
        self.text_token_counts[1] += int(ids.numel())
        img = torch.as_tensor(chunk, dtype=torch.long, device=self.device)
        whole = chunk == list(range(len(memo)))  # decided on the host: no read of the device
        got = self._itm_grouped(ids.to(self.device), mask.to(self.device), memo, img, per, whole)
        rows_kept = [r for r, d in enumerate(dest) if d >= 0]  # chosen on the host: no device read
        to = torch.as_tensor([dest[r] for r in rows_kept], dtype=torch.long, device=self.device)
        probs[to] = got[torch.as_tensor(rows_kept, dtype=torch.long, device=self.device)]

    def _itm_grouped(
        self, ids: torch.Tensor, mask: torch.Tensor, memo: ImageMemo, img: torch.Tensor, per: int,
        whole: bool | None = None,
    ) -> torch.Tensor:
        """ITM probabilities (float32, on the device) for rows ``ids`` [n*per, L] where rows n*per..(n+1)*per-1 belong to image
        ``img[n]``. Cross-attention runs once per image over all of its captions' queries (keys and
        values of the image tokens come from the memo, never recomputed or copied per caption)."""
        enc = self.model.text_encoder
        h = enc.embeddings(input_ids=ids)
        neg = torch.finfo(h.dtype).min
        self_mask = torch.zeros(mask.shape, dtype=h.dtype, device=h.device).masked_fill(mask == 0, neg)[:, None, None, :]
        rows, width = ids.shape
        n = rows // per
        heads, dh = self.heads, self.head_dim
        if whole is None:  # img is every image of the memo, in order: its K/V are used as they are
            whole = img.numel() == len(memo) and bool((img == torch.arange(len(memo), device=img.device)).all())
        for layer, (k_all, v_all) in zip(self.text_layers, memo.cross_kv, strict=True):
            attn_out, _ = layer.attention(h, attention_mask=self_mask)
            cross = layer.crossattention
            q = cross.self.query(attn_out).view(n, per, width, heads, dh)
            q = q.permute(0, 3, 1, 2, 4).reshape(n, heads, per * width, dh)
            k = k_all if whole else k_all.index_select(0, img)
            v = v_all if whole else v_all.index_select(0, img)
            ctx = torch.nn.functional.scaled_dot_product_attention(q, k, v)  # [n, heads, per*width, dh]
            ctx = ctx.view(n, heads, per, width, dh).permute(0, 2, 3, 1, 4).reshape(rows, width, heads * dh)
            cross_out = cross.output(ctx, attn_out)
            h = layer.feed_forward_chunk(cross_out)
        logits = self.model.itm_head(h[:, 0, :]).float()
        return logits.softmax(dim=-1)[:, 1]  # on the device: the caller reads once per score() call

    def _pair_logits(self, pixels: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The plain ``model(input_ids, pixel_values, use_itm_head=True)`` forward's ITM logits."""
        return self.model(input_ids=ids.to(self.device), pixel_values=pixels, attention_mask=mask.to(self.device),
                          use_itm_head=True).itm_score


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def quiet_progress() -> Iterator[None]:
    """No transformers progress bars while loading/saving (restored afterwards)."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def load_verifier(
    model: str | os.PathLike = DEFAULT_VERIFIER,
    *,
    device: str | torch.device = "auto",
    precision: str = "auto",
    max_text_tokens: int = 35,
    first_token: str = "enc",
    caption_preprocess: str = "lavis",
    image_batch_size: int = 16,
    pair_batch_size: int = 256,
    cache_dir: str | None = None,
    tokenizer: str = "bert-base-uncased",
    text_token_budget: int | None = None,
    attention: str = "eager",
) -> Verifier:
    """Load a BLIP ITM verifier from a Hugging Face id, a local save_pretrained directory or a LAVIS
    ``.pth`` checkpoint (converted at load time; ``tokenizer`` is its BERT tokenizer)."""
    from transformers import BlipForImageTextRetrieval

    from adjcap.models.blip_lavis import load_lavis_checkpoint

    dev = pick_device(device)
    dtype = pick_dtype(precision, dev)
    if str(model).endswith(".pth"):  # a LAVIS checkpoint: renamed to the transformers layout, strictly
        net, tok, image_processor, model_id = load_lavis_checkpoint(
            str(model), tokenizer=tokenizer, cache_dir=cache_dir, local_files_only=hf_offline())
        return _verifier(net, tok, image_processor, model_id, dev, dtype, max_text_tokens, first_token,
                         caption_preprocess, image_batch_size, pair_batch_size, text_token_budget, attention)
    net, tok, image_processor, model_id = from_hub_or_dir(BlipForImageTextRetrieval, model, "BLIP ITM verifier",
                                                         dtype, cache_dir)
    return _verifier(net, tok, image_processor, model_id, dev, dtype, max_text_tokens, first_token,
                     caption_preprocess, image_batch_size, pair_batch_size, text_token_budget, attention)


def from_hub_or_dir(model_cls: Any, model: str | os.PathLike, what: str, dtype: torch.dtype,
                    cache_dir: str | None = None) -> tuple[Any, Any, Any, str]:
    """(model, tokenizer, LAVIS eval transform, model id) of a BLIP-family ITM checkpoint (``model_cls``:
    BLIP's or BLIP-2's transformers class) from a hub id or a local ``save_pretrained`` directory; one
    line naming what to do when it cannot be had."""
    from transformers import AutoTokenizer

    src = hub_or_dir(model, what=what, config_key="verifier.model", cache_dir=cache_dir)
    try:
        with quiet_progress():
            net = model_cls.from_pretrained(src.source, dtype=dtype, cache_dir=cache_dir,
                                            local_files_only=src.local_only)
        tok = AutoTokenizer.from_pretrained(src.source, cache_dir=cache_dir, local_files_only=src.local_only)
        image_processor = eval_transform(src, cache_dir)
    except OSError as e:
        if src.is_dir:
            raise FileNotFoundError(f"{src.source}: incomplete {what} directory ({e})") from e
        raise ModelUnavailableError(
            f"{what} '{src.source}' could not be loaded ({str(e).splitlines()[0]}): download it with "
            f"`adjcap prepare models` or `huggingface-cli download {src.source} --local-dir DIR` and set "
            "verifier.model=DIR") from e
    return net, tok, image_processor, src.model_id


def frozen(net: Any, device: torch.device, dtype: torch.dtype | None = None) -> Any:
    """``net`` on ``device`` (in ``dtype``, unless None: the dtypes it loaded in), in eval mode, no gradients."""
    net = net.to(device=device, dtype=dtype).eval()
    for p in net.parameters():
        p.requires_grad_(False)
    return net


def eval_transform(src, cache_dir: str | None = None):
    """LAVIS's eval transform (PIL bicubic squash, /255, normalise) with the size, mean and std of the
    ``preprocessor_config.json`` of ``src`` (:func:`adjcap.models.sources.hub_or_dir`): BLIP's and BLIP-2's."""
    from transformers import BlipImageProcessor

    from adjcap.models.blip_lavis import LavisEvalTransform

    return LavisEvalTransform.like(
        BlipImageProcessor.from_pretrained(src.source, cache_dir=cache_dir, local_files_only=src.local_only))


def pixel_prep_for(model: str | os.PathLike, what: str = "BLIP ITM verifier", cache_dir: str | None = None):
    """The :attr:`Verifier.pixel_prep` a BLIP or BLIP-2 verifier from ``model`` has, read from its
    preprocessor config without loading weights (None: a LAVIS ``.pth`` checkpoint, or not known here:
    the job then hands the pools the image's bytes)."""
    if str(model).endswith(".pth"):
        return None
    try:
        src = hub_or_dir(model, what=what, config_key="verifier.model", cache_dir=cache_dir)
        return eval_transform(src, cache_dir).pixel_prep
    except Exception:  # noqa: BLE001 - unknown before loading: the pools decode themselves
        return None


def verifier_pixel_prep(cfg: VerifierCfg):
    """The pixel preparation of a BLIP or BLIP-2 verifier section (its family's ``pixels``)."""
    from adjcap.engine.verifier_families import of

    return pixel_prep_for(cfg.model, of(cfg).title)


def _verifier(net, tok, image_processor, model_id, dev, dtype, max_text_tokens, first_token, caption_preprocess,
              image_batch_size, pair_batch_size, text_token_budget=None, attention="eager") -> Verifier:
    if attention not in ("eager", "sdpa"):
        raise ValueError(f"verifier attention must be 'eager' or 'sdpa'; got {attention!r} (verifier.attention)")
    net = frozen(net, dev, dtype)
    if attention == "sdpa":
        from adjcap.models.blip_sdpa import use_sdpa

        use_sdpa(net.vision_model)
    return Verifier(
        net,
        tok,
        image_processor,
        model_id=model_id,
        device=dev,
        dtype=dtype,
        max_text_tokens=max_text_tokens,
        first_token=first_token,
        caption_preprocess=caption_preprocess,
        image_batch_size=image_batch_size,
        pair_batch_size=pair_batch_size,
        text_token_budget=text_token_budget,
    )


def load_verifier_from_config(cfg: VerifierCfg, *, device: str = "auto") -> Verifier:
    """Load from a resolved ``VerifierCfg`` (the transformers backend)."""
    if cfg.backend != "transformers":
        raise ValueError(f"verifier.backend='{cfg.backend}' runs in its own environment inside the Ray job "
                         "(adjcap run-job); use verifier.backend='transformers' here")
    return load_verifier(
        cfg.model,
        device=device,
        precision=cfg.precision,
        max_text_tokens=cfg.max_text_tokens,
        first_token=cfg.itm_first_token,
        caption_preprocess=cfg.caption_preprocess,
        image_batch_size=cfg.batch_size,
        tokenizer=cfg.tokenizer,
        text_token_budget=cfg.text_token_budget or None,
        attention=cfg.attention,
    )

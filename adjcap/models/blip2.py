"""The BLIP-2 ITM verifier (``verifier.family = "blip2_itm"``): transformers ``Blip2ForImageTextRetrieval``
with its image-text matching head, one image against many captions.

``load_blip2_verifier("Salesforce/blip2-itm-vit-g")`` (or a local ``save_pretrained`` directory) returns
a :class:`Blip2Verifier` with the verifier interface :mod:`adjcap.engine.stages` calls (as
:class:`adjcap.models.blip.Verifier`):

* :meth:`Blip2Verifier.encode_images` runs the (large, frozen) vision encoder once per image; its output
  is the memo stage 4 reuses (``image_embeds``, carried in the image's state);
* :meth:`Blip2Verifier.score` runs the Q-Former with the model's learnt query tokens and each caption's
  tokens against that memo, then the ITM head averaged over the query positions, as the model's own
  ITM forward does; captions are bucketed by length;
* :meth:`Blip2Verifier.score_pairs` is the plain per-pair ``model(pixel_values, input_ids,
  attention_mask, use_image_text_matching_head=True)`` forward: the reference the memo path is
  tested against.

The score is the softmax match probability (class 1) of the ITM logits, in (0, 1). Text follows LAVIS's
BLIP-2 ITM: captions cleaned by ``pre_caption`` when ``caption_preprocess="lavis"``, the tokenizer's
own [CLS] ... [SEP] (BLIP-2's Q-Former has no [ENC] token: ``verifier.itm_first_token`` is not read),
truncated at ``max_text_tokens``. Images go through LAVIS's eval transform with the checkpoint's image
processor's size, mean and std (:class:`adjcap.models.blip_lavis.LavisEvalTransform`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from adjcap.config import VerifierCfg
from adjcap.models.blip import ItmJudge, from_hub_or_dir, frozen
from adjcap.models.precision import pick_device, pick_dtype

BLIP2_VERIFIER = "Salesforce/blip2-itm-vit-g"


@dataclass
class Blip2Memo:
    """The vision encoder's output per image, reused by every caption of the image."""

    image_embeds: torch.Tensor  # [n, P, Dv]

    def __len__(self) -> int:
        return int(self.image_embeds.shape[0])


class Blip2Verifier(ItmJudge):
    """A BLIP-2 ITM model with its tokenizer and image transform on one device (the shared half:
    :class:`adjcap.models.blip.ItmJudge`; BLIP-2's Q-Former has no [ENC]: the tokenizer's [CLS] stays)."""

    family = "blip2_itm"

    def __init__(self, model: Any, tokenizer: Any, image_processor: Any, **kw: Any) -> None:
        super().__init__(model, tokenizer, image_processor, **kw)
        pad = model.config.qformer_config.pad_token_id
        self.pad_id = int(pad if pad is not None else (tokenizer.pad_token_id or 0))

    # ---- images ------------------------------------------------------------------------------
    def _encode_batch(self, batch: torch.Tensor) -> torch.Tensor:
        """The vision encoder's last hidden state (in the vision tower's own dtype)."""
        vision_dtype = next(self.model.vision_model.parameters()).dtype
        return self.model.vision_model(pixel_values=batch.to(self.device, dtype=vision_dtype))[0]

    def _memo(self, parts: list[torch.Tensor]) -> Blip2Memo:
        return Blip2Memo(torch.cat(parts))

    def memo_from_image_embeds(self, embeds: torch.Tensor) -> Blip2Memo:
        """A memo from vision-encoder outputs computed earlier (stage 2's, carried in the state)."""
        return Blip2Memo(embeds.to(self.device))

    # ---- scoring -----------------------------------------------------------------------------
    @torch.inference_mode()
    def score(self, memo: Blip2Memo, texts_per_image: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """ITM match probabilities: one float32 array per image, one value per caption, in order."""
        if len(texts_per_image) != len(memo):
            raise ValueError(f"score: {len(texts_per_image)} caption lists for {len(memo)} encoded images")
        counts = [len(t) for t in texts_per_image]
        seqs = self.tokenize([t for texts in texts_per_image for t in texts])
        owner = np.repeat(np.arange(len(memo)), counts)
        probs = np.zeros(len(seqs), dtype=np.float32)
        order = sorted(range(len(seqs)), key=lambda j: len(seqs[j]))  # similar lengths share a chunk
        for start in range(0, len(order), self.pair_batch_size):
            rows = order[start : start + self.pair_batch_size]
            ids, mask = self.pad([seqs[j] for j in rows])
            img = torch.as_tensor(owner[rows], dtype=torch.long, device=self.device)
            probs[rows] = self.itm(memo.image_embeds.index_select(0, img), ids, mask)
        starts = np.concatenate([[0], np.cumsum(counts)]).astype(int)
        return [probs[starts[i] : starts[i + 1]].copy() for i in range(len(memo))]

    def itm_logits(self, image_embeds: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The ITM logits [n, 2] of rows (image_embeds[i], ids[i]): the model's ITM branch after its
        vision encoder (query tokens + text through the Q-Former, ITM head averaged over the queries)."""
        m = self.model
        n = ids.shape[0]
        query = m.query_tokens.expand(n, -1, -1)
        ids, mask = ids.to(self.device), mask.to(self.device)
        att = torch.cat([torch.ones(query.shape[:-1], dtype=torch.long, device=self.device), mask], dim=1)
        embeds = m.embeddings(input_ids=ids, query_embeds=query)
        image_att = torch.ones(image_embeds.shape[:-1], dtype=torch.long, device=self.device)
        out = m.qformer(query_embeds=embeds, query_length=query.shape[1], attention_mask=att,
                        encoder_hidden_states=image_embeds, encoder_attention_mask=image_att).last_hidden_state
        out = out.to(dtype=m.itm_head.weight.dtype)
        return m.itm_head(out[:, : query.shape[1], :]).mean(dim=1)

    def itm(self, image_embeds: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> np.ndarray:
        return self.itm_logits(image_embeds, ids, mask).float().softmax(dim=-1)[:, 1].cpu().numpy()

    def _pair_logits(self, pixels: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The model's own ITM forward (``use_image_text_matching_head=True``) per pair."""
        cfg = self.model.config
        if cfg.image_token_index is not None:  # the processor's layout: the query positions in the text
            q = cfg.num_query_tokens
            ids = torch.cat([torch.full((ids.shape[0], q), cfg.image_token_index, dtype=torch.long), ids], 1)
            mask = torch.cat([torch.ones((mask.shape[0], q), dtype=torch.long), mask], 1)
        return self.model(pixel_values=pixels, input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                          use_image_text_matching_head=True).logits_per_image

def load_blip2_verifier(model: str | os.PathLike = BLIP2_VERIFIER, *, device: str | torch.device = "auto",
                        precision: str = "auto", max_text_tokens: int = 35, caption_preprocess: str = "lavis",
                        image_batch_size: int = 16, pair_batch_size: int = 256,
                        cache_dir: str | None = None) -> Blip2Verifier:
    """Load a BLIP-2 ITM verifier from a Hugging Face id or a local save_pretrained directory. The
    Q-Former and query tokens stay in fp32 at any precision (the model class keeps them so)."""
    from transformers import Blip2ForImageTextRetrieval

    dev = pick_device(device)
    dtype = pick_dtype(precision, dev)
    net, tok, image_processor, model_id = from_hub_or_dir(Blip2ForImageTextRetrieval, model, "BLIP-2 ITM verifier",
                                                         dtype, cache_dir)
    net = frozen(net, dev)  # the dtypes it loaded in: the Q-Former stays fp32
    return Blip2Verifier(net, tok, image_processor, model_id=model_id, device=dev, dtype=dtype,
                         max_text_tokens=max_text_tokens, caption_preprocess=caption_preprocess,
                         image_batch_size=image_batch_size, pair_batch_size=pair_batch_size)


def load_blip2_from_config(cfg: VerifierCfg, *, device: str = "auto") -> Blip2Verifier:
    """Load from a resolved ``VerifierCfg`` (``family = "blip2_itm"``)."""
    return load_blip2_verifier(cfg.model, device=device, precision=cfg.precision, max_text_tokens=cfg.max_text_tokens,
                               caption_preprocess=cfg.caption_preprocess, image_batch_size=cfg.batch_size)

"""The ``lavis`` verifier backend: salesforce-lavis's own ``blip_image_text_matching`` model and processors.

This module runs inside the isolated LAVIS environment (``adjcap lavis-env``; transformers 4.26, timm
0.4.12): it imports ``lavis`` and, from adjcap, only :mod:`adjcap.models.blip_lavis` (torch, numpy, PIL).

The model is LAVIS's ``BlipITM`` built from LAVIS's own ``VisionTransformerEncoder`` and ``XBertEncoder``
(``configs/models/med_large_config.json`` with the widths, depths, vocabulary and positions read off the
checkpoint, so the released ``large`` files give exactly LAVIS's ``large`` model and a small test model
gives the same classes at small size), and the weights are loaded by LAVIS's ``load_checkpoint``. LAVIS
loads with ``strict=False``; here a missing key, or a left-over key outside the known ITM-unused training
state, is an error naming the file.

Scores are LAVIS's ITM computation: ``BlipImageEvalProcessor`` and ``BlipCaptionProcessor`` (the
``blip_image_eval`` / ``blip_caption`` eval processors of the model's config), the vision encoder once
per image, then LAVIS's ``forward(match_head="itm")`` text side ([ENC] first, 35 tokens, padding to the
longest) against that image's embeddings; :meth:`LavisVerifier.score_pairs` is ``model(samples,
match_head="itm")`` itself, the reference.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from adjcap.models.blip_lavis import LavisCheckpointError, file_fingerprint, is_itm_unused, lavis_dims, read_lavis_state_dict

BERT_BASE = "bert-base-uncased"


@contextlib.contextmanager
def lavis_tokenizer_source(source: str) -> Iterator[None]:
    """Make LAVIS's ``init_tokenizer`` (``BertTokenizer.from_pretrained("bert-base-uncased")``) read
    ``source`` (a local directory or hub id) instead; LAVIS then appends [DEC] and [ENC] as usual."""
    import lavis.models.blip_models.blip as lavis_blip

    original = lavis_blip.BertTokenizer
    if source == BERT_BASE:
        yield
        return

    class _Local(original):  # type: ignore[misc, valid-type]
        @classmethod
        def from_pretrained(cls, name, *args, **kwargs):
            return original.from_pretrained(source if name == BERT_BASE else name, *args, **kwargs)

    lavis_blip.BertTokenizer = _Local
    try:
        yield
    finally:
        lavis_blip.BertTokenizer = original


def build_lavis_itm(dims: dict[str, int], tokenizer: str = BERT_BASE) -> Any:
    """LAVIS's ``BlipITM`` with LAVIS's encoders at the given architecture (random weights)."""
    from lavis.common.utils import get_abs_path
    from lavis.models.blip_models.blip_image_text_matching import BlipITM
    from lavis.models.med import BertConfig, XBertEncoder
    from lavis.models.vit import VisionTransformerEncoder

    vit = VisionTransformerEncoder(
        img_size=dims["image_size"], patch_size=dims["patch_size"], embed_dim=dims["vision_width"],
        depth=dims["vision_layers"], num_heads=dims["vision_heads"],
        mlp_ratio=dims["vision_mlp"] / dims["vision_width"],
    )
    vit.vision_width = dims["vision_width"]  # what VisionTransformerEncoder.from_config sets
    med = json.loads(Path(get_abs_path("configs/models/med_large_config.json")).read_text())
    med.update(
        hidden_size=dims["text_width"], num_hidden_layers=dims["text_layers"],
        num_attention_heads=dims["text_heads"], intermediate_size=dims["text_intermediate"],
        vocab_size=dims["vocab_size"], max_position_embeddings=dims["max_positions"],
        encoder_width=dims["encoder_width"],
    )
    text = XBertEncoder(config=BertConfig(**med), add_pooling_layer=False)
    with lavis_tokenizer_source(tokenizer):
        return BlipITM(image_encoder=vit, text_encoder=text, embed_dim=dims["embed_dim"], max_txt_len=35)


@dataclass
class LavisMemo:
    """The vision encoder's output per image, reused for all of that image's captions."""

    image_embeds: torch.Tensor  # [n, P, D]

    def __len__(self) -> int:
        return int(self.image_embeds.shape[0])


class LavisVerifier:
    """LAVIS's BLIP ITM with its eval processors: the verifier interface of adjcap.engine.stages."""

    backend = "lavis"

    def __init__(self, model: Any, *, model_id: str, device: torch.device, image_batch_size: int = 16,
                 pair_batch_size: int = 256) -> None:
        from lavis.processors.blip_processors import BlipCaptionProcessor, BlipImageEvalProcessor

        self.model = model.to(device).eval()
        self.model_id = model_id
        self.device = device
        self.dtype = torch.float32
        self.image_size = int(model.visual_encoder.patch_embed.img_size[0])
        self.vis_processor = BlipImageEvalProcessor(image_size=self.image_size)
        self.text_processor = BlipCaptionProcessor()
        self.image_batch_size = int(image_batch_size)
        self.pair_batch_size = int(pair_batch_size)

    @property
    def precision(self) -> str:
        return "fp32"

    def preprocess(self, images: Sequence[Image.Image]) -> torch.Tensor:
        return torch.stack([self.vis_processor(im.convert("RGB")) for im in images])

    @torch.inference_mode()
    def encode_images(self, images: Sequence[Image.Image]) -> LavisMemo:
        items = list(images)
        if not items:
            raise ValueError("encode_images needs at least one image")
        out = []
        for start in range(0, len(items), self.image_batch_size):
            pixels = self.preprocess(items[start : start + self.image_batch_size]).to(self.device)
            out.append(self.model.visual_encoder.forward_features(pixels))
        return LavisMemo(torch.cat(out))

    def memo_from_image_embeds(self, embeds: torch.Tensor) -> LavisMemo:
        return LavisMemo(embeds.to(self.device, dtype=torch.float32))

    @torch.inference_mode()
    def _itm(self, image_embeds: torch.Tensor, captions: list[str]) -> np.ndarray:
        """LAVIS ``BlipITM.forward(match_head="itm")`` after its vision encoder, then softmax[:, 1]."""
        m = self.model
        image_atts = torch.ones(image_embeds.size()[:-1], dtype=torch.long).to(self.device)
        text = m.tokenizer(captions, padding="longest", truncation=True, max_length=m.max_txt_len,
                           return_tensors="pt").to(self.device)
        ids = text.input_ids.clone()
        ids[:, 0] = m.tokenizer.enc_token_id
        out = m.text_encoder(ids, attention_mask=text.attention_mask, encoder_hidden_states=image_embeds,
                             encoder_attention_mask=image_atts, return_dict=True)
        logits = m.itm_head(out.last_hidden_state[:, 0, :])
        return torch.nn.functional.softmax(logits, dim=1)[:, 1].float().cpu().numpy()

    def score(self, memo: LavisMemo, texts_per_image: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """ITM match probabilities: one float32 array per image, one value per caption, in order."""
        if len(texts_per_image) != len(memo):
            raise ValueError(f"score: {len(texts_per_image)} caption lists for {len(memo)} encoded images")
        out = []
        for i, texts in enumerate(texts_per_image):
            caps = [self.text_processor(t) for t in texts]
            probs = np.zeros(len(caps), dtype=np.float32)
            for s in range(0, len(caps), self.pair_batch_size):
                chunk = caps[s : s + self.pair_batch_size]
                emb = memo.image_embeds[i : i + 1].expand(len(chunk), -1, -1)
                probs[s : s + len(chunk)] = self._itm(emb, chunk)
            out.append(probs)
        return out

    @torch.inference_mode()
    def score_pairs(self, images: Sequence[Image.Image], texts: Sequence[str], batch_size: int = 16) -> np.ndarray:
        """Reference: LAVIS's ``model({"image", "text_input"}, match_head="itm")``, ``images[i]`` with ``texts[i]``."""
        if len(images) != len(texts):
            raise ValueError(f"score_pairs: {len(images)} images for {len(texts)} texts")
        out = np.zeros(len(texts), dtype=np.float32)
        for s in range(0, len(texts), batch_size):
            pix = self.preprocess(images[s : s + batch_size]).to(self.device)
            caps = [self.text_processor(t) for t in texts[s : s + batch_size]]
            logits = self.model({"image": pix, "text_input": caps}, match_head="itm")
            out[s : s + len(caps)] = torch.nn.functional.softmax(logits, dim=1)[:, 1].float().cpu().numpy()
        return out


def load_lavis_verifier(path: str | os.PathLike, *, tokenizer: str = BERT_BASE, device: str = "auto",
                        image_batch_size: int = 16) -> LavisVerifier:
    """LAVIS's BLIP ITM from a LAVIS ``.pth`` (loaded by LAVIS's ``load_checkpoint``, checked complete)."""
    p = Path(os.path.expanduser(str(path)))
    if p.suffix != ".pth":
        raise ValueError(f"{p}: verifier.backend='lavis' needs a LAVIS .pth checkpoint as verifier.model "
                         "(model_large_retrieval_coco.pth or ..._flickr.pth)")
    sd = read_lavis_state_dict(p)  # weights_only; also what LAVIS's own torch.load will read
    model = build_lavis_itm(lavis_dims(sd, p), tokenizer)
    msg = model.load_checkpoint(str(p))
    unexpected = [k for k in msg.unexpected_keys if not is_itm_unused(k)]
    if msg.missing_keys or unexpected:
        what = [f"missing {', '.join(sorted(msg.missing_keys)[:3])}"] if msg.missing_keys else []
        what += [f"unexpected {', '.join(sorted(unexpected)[:3])}"] if unexpected else []
        raise LavisCheckpointError(f"{p}: not a complete LAVIS BLIP ITM checkpoint: {'; '.join(what)}")
    if len(model.tokenizer) != model.text_encoder.config.vocab_size:
        raise LavisCheckpointError(
            f"{p}: tokenizer '{tokenizer}' + [DEC], [ENC] has {len(model.tokenizer)} tokens but the checkpoint's "
            f"text embedding has {model.text_encoder.config.vocab_size}; set verifier.tokenizer")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return LavisVerifier(model, model_id=f"{p.name}/{file_fingerprint(p)}", device=torch.device(device),
                         image_batch_size=image_batch_size)


def load_from_config(v: Any, *, device: str = "auto") -> LavisVerifier:
    """The verifier section's LAVIS judge (``verifier.backend = "lavis"``: adjcap.engine.verifier_families)."""
    return load_lavis_verifier(v.model, tokenizer=v.tokenizer, device=device, image_batch_size=v.batch_size)

"""An open_clip dual encoder as the verifier (``verifier.family = "clip"``): SigLIP
(``ViT-SO400M-14-SigLIP-384`` / ``webli``) or any other open_clip model judges an (image, caption) pair
by the similarity of their embeddings.

The score, per pair, from the unit-norm embeddings' cosine ``c``, the model's learnt ``logit_scale``
``s`` (used as ``exp(logit_scale)``, as open_clip does) and, where the model has one, its ``logit_bias``
``b``:

* with a logit bias (SigLIP, trained with the sigmoid loss): ``sigmoid(s * c + b)``, in (0, 1): the
  model's own probability that the pair matches;
* without one (CLIP, trained with a softmax over the batch, so a single pair has no probability):
  ``(c + 1) / 2``, the cosine mapped to [0, 1].

Both equal what the model's own forward gives (``model(image, text)`` returns the features, the scale and
the bias). The verifier interface is :class:`adjcap.models.blip.Verifier`'s: :meth:`encode_images`
returns the memo stage 4 reuses (the unit image embeddings), :meth:`score` scores any number of captions
per image against it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from adjcap.config import EncoderCfg, VerifierCfg


@dataclass
class ClipMemo:
    image_embeds: torch.Tensor  # [n, D], unit norm

    def __len__(self) -> int:
        return int(self.image_embeds.shape[0])


class ClipVerifier:
    """A :class:`adjcap.models.clip.DualEncoder` judging pairs (see the module docstring for the score)."""

    backend = "open_clip"
    family = "clip"

    def __init__(self, encoder) -> None:
        self.encoder = encoder
        model = encoder.model
        self.scale = float(model.logit_scale.detach().float().exp())
        bias = getattr(model, "logit_bias", None)
        self.bias = None if bias is None else float(bias.detach().float().reshape(-1)[0])

    @property
    def model_id(self) -> str:
        return self.encoder.model_id

    @property
    def precision(self) -> str:
        return self.encoder.precision

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9._-]+", "_", self.model_id).strip("_")

    @property
    def kind(self) -> str:
        """How the score is made: ``sigmoid`` (a model with a logit bias) or ``cosine``."""
        return "cosine" if self.bias is None else "sigmoid"

    def from_cosine(self, cos: torch.Tensor) -> torch.Tensor:
        cos = cos.float()
        return (cos + 1) / 2 if self.bias is None else torch.sigmoid(self.scale * cos + self.bias)

    @property
    def pixel_prep(self):
        return self.encoder.pixel_prep

    @torch.inference_mode()
    def encode_images(self, images: Sequence[Image.Image] | torch.Tensor) -> ClipMemo:
        return ClipMemo(self.encoder.encode_images(images, normalize=True))

    def memo_from_image_embeds(self, embeds: torch.Tensor) -> ClipMemo:
        return ClipMemo(embeds.to(self.encoder.device))

    @torch.inference_mode()
    def score(self, memo: ClipMemo, texts_per_image: Sequence[Sequence[str]]) -> list[np.ndarray]:
        """One float32 array per image, one score per caption, in order."""
        if len(texts_per_image) != len(memo):
            raise ValueError(f"score: {len(texts_per_image)} caption lists for {len(memo)} encoded images")
        flat = [t for texts in texts_per_image for t in texts]
        if not flat:
            return [np.zeros(0, np.float32) for _ in texts_per_image]
        text = self.encoder.encode_texts(flat, normalize=True)
        owner = torch.as_tensor(np.repeat(np.arange(len(memo)), [len(t) for t in texts_per_image]),
                                device=text.device)
        img = memo.image_embeds.float().to(text.device).index_select(0, owner)
        probs = self.from_cosine((img * text).sum(-1)).cpu().numpy().astype(np.float32)
        out, start = [], 0
        for texts in texts_per_image:
            out.append(probs[start : start + len(texts)].copy())
            start += len(texts)
        return out

    def score_images(self, images: Sequence[Image.Image], texts_per_image: Sequence[Sequence[str]]) -> list[np.ndarray]:
        return self.score(self.encode_images(images), texts_per_image)

    @torch.inference_mode()
    def score_pairs(self, images: Sequence[Image.Image] | torch.Tensor, texts: Sequence[str]) -> np.ndarray:
        """Reference: open_clip's own forward ``model(image, text)`` per pair (padded text, whole model),
        its features' cosine turned into the score with the scale and bias it returns."""
        enc = self.encoder
        pix = images if isinstance(images, torch.Tensor) else enc.preprocess(list(images))
        ids = enc.tokenize(list(texts)).ids
        out = enc.model(pix.to(enc.device, dtype=enc.dtype), ids.to(enc.device))
        if not isinstance(out, dict):  # open_clip's tuple: features, exp(logit_scale)[, logit_bias]
            out = dict(zip(("image_features", "text_features", "logit_scale", "logit_bias"), out))
        img, txt = out["image_features"].float(), out["text_features"].float()
        logit = (img * txt).sum(-1)
        if self.bias is None:
            return ((logit + 1) / 2).cpu().numpy().astype(np.float32)
        scale = out["logit_scale"].float().reshape(-1)[0]
        return torch.sigmoid(scale * logit + out["logit_bias"].float().reshape(-1)[0]).cpu().numpy().astype(np.float32)


def verifier_encoder(cfg: VerifierCfg) -> EncoderCfg:
    """The verifier section as the open_clip encoder it names (model, pretrained, precision, batch)."""
    return EncoderCfg(model=cfg.model, pretrained=cfg.pretrained, precision=cfg.precision,
                      image_batch_size=cfg.batch_size)


def verifier_pixel_prep(cfg: VerifierCfg):
    """The open_clip verifier's pixel preparation, without loading it (the family's ``pixels``)."""
    from adjcap.models.clip import pixel_prep_for

    return pixel_prep_for(verifier_encoder(cfg))


def load_clip_verifier_from_config(cfg: VerifierCfg, *, device: str = "auto") -> ClipVerifier:
    """Load from a resolved ``VerifierCfg`` (``family = "clip"``)."""
    from adjcap.models.clip import load_encoder_from_config

    return ClipVerifier(load_encoder_from_config(verifier_encoder(cfg), device=device))

"""BLIP's vision attention through ``torch.nn.functional.scaled_dot_product_attention`` (issue 38 item 8).

transformers' ``BlipAttention`` (5.x) has no attention-implementation switch: it multiplies queries by
keys, softmaxes and multiplies by values itself (577 tokens x 24 layers for BLIP-large at 384 px), so
a GPU runs three kernels and writes the [heads, 577, 577] probabilities to memory per layer instead
of one fused (flash / memory-efficient) kernel. :func:`use_sdpa` replaces each vision layer's
attention by :class:`SdpaBlipAttention`, which holds the *same* ``qkv`` and ``projection`` modules
(the state dict is unchanged) and computes softmax(q k^T * scale) v in one call: equal to the eager
path within float rounding (tests/test_blip_verifier.py holds it to 1e-5 on the tiny BLIP). Only
inference: attention dropout (0 in every BLIP ITM config) is not applied.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class SdpaBlipAttention(torch.nn.Module):
    """``BlipAttention``'s forward with one fused attention call; same parameters, same outputs."""

    def __init__(self, eager: torch.nn.Module) -> None:
        super().__init__()
        self.qkv = eager.qkv
        self.projection = eager.projection
        self.num_heads = int(eager.num_heads)
        self.scale = float(eager.scale)

    def forward(self, hidden_states: torch.Tensor, **kwargs) -> tuple[torch.Tensor, None]:
        b, t, e = hidden_states.shape
        qkv = self.qkv(hidden_states).reshape(b, t, 3, self.num_heads, e // self.num_heads).permute(2, 0, 3, 1, 4)
        ctx = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], scale=self.scale)
        return self.projection(ctx.transpose(1, 2).reshape(b, t, e)), None


def use_sdpa(vision_model: torch.nn.Module) -> int:
    """Swap every ``BlipAttention`` of a ``BlipVisionModel`` for :class:`SdpaBlipAttention` in place;
    returns how many layers were swapped (0: nothing of that shape found, the model is left as is)."""
    n = 0
    for layer in getattr(getattr(vision_model, "encoder", None), "layers", []):
        att = getattr(layer, "self_attn", None)
        if att is not None and not isinstance(att, SdpaBlipAttention) and hasattr(att, "qkv") and hasattr(att, "projection"):
            layer.self_attn = SdpaBlipAttention(att)
            n += 1
    return n

"""The two learned heads: TriFuse (113 parameters) and MemAttend (17,377 parameters), and the
registry of their specs (:data:`HEADS`).

Both map per-image z-normalised features to one score per beam candidate; the caption is the argmax
over the valid beam. Paper sections "TriFuse" and "MemAttend".

A :class:`HeadSpec` says everything that fitting, scoring and persistence need to know about a head:
its class, its section of ``RerankCfg`` (learning rate, epochs and the architecture fields), which
feature tensors its ``forward`` takes, the chunk size used when fitting on CPU, and its weights file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from adjcap.rerank.features import BeamFeatures
from adjcap.registry import Registry


def count_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


class TriFuse(nn.Module):
    """3 -> h -> h -> 1 MLP with GELU on [LM, retrieval cosine, verifier] per candidate.

    With h = 8: 32 + 72 + 9 = 113 parameters."""

    def __init__(self, hidden: int = 8, in_features: int = 3):
        super().__init__()
        self.hidden = int(hidden)
        self.in_features = int(in_features)
        self.net = nn.Sequential(
            nn.Linear(self.in_features, self.hidden),
            nn.GELU(),
            nn.Linear(self.hidden, self.hidden),
            nn.GELU(),
            nn.Linear(self.hidden, 1),
        )

    def config(self) -> dict[str, Any]:
        return {"hidden": self.hidden, "in_features": self.in_features}

    def forward(self, scores: torch.Tensor) -> torch.Tensor:
        """scores [I, N, 3] -> [I, N]."""
        return self.net(scores).squeeze(-1)


class MemAttend(nn.Module):
    """Memory-augmented transformer head.

    Tokens: M memory tokens (verified retrievals) followed by N beam tokens, each a 5-d feature
    vector. h0 = W_in f + role[memory|beam]; two standard post-norm ``nn.TransformerEncoderLayer``
    (d=32, 4 heads, FFN 64, GELU, dropout 0, batch_first); a 32 -> 1 score head on the beam tokens.
    Missing memory entries and padded beam entries are excluded as attention keys
    (``src_key_padding_mask``). Defaults: 192 + 64 + 2 x 8,544 + 33 = 17,377 parameters."""

    def __init__(self, d_model: int = 32, layers: int = 2, heads: int = 4, ffn: int = 64, in_features: int = 5):
        super().__init__()
        self.d_model, self.n_layers, self.n_heads, self.ffn = int(d_model), int(layers), int(heads), int(ffn)
        self.in_features = int(in_features)
        self.w_in = nn.Linear(self.in_features, self.d_model)
        self.role = nn.Embedding(2, self.d_model)  # 0 = memory token, 1 = beam token
        self.layers = nn.ModuleList(
            [
                nn.TransformerEncoderLayer(
                    d_model=self.d_model,
                    nhead=self.n_heads,
                    dim_feedforward=self.ffn,
                    dropout=0.0,
                    activation="gelu",
                    batch_first=True,
                )
                for _ in range(self.n_layers)
            ]
        )
        self.head = nn.Linear(self.d_model, 1)

    def config(self) -> dict[str, Any]:
        return {
            "d_model": self.d_model,
            "layers": self.n_layers,
            "heads": self.n_heads,
            "ffn": self.ffn,
            "in_features": self.in_features,
        }

    def forward(
        self,
        beam: torch.Tensor,
        memory: torch.Tensor,
        beam_mask: torch.Tensor,
        memory_mask: torch.Tensor,
    ) -> torch.Tensor:
        """beam [I, N, 5], memory [I, M, 5], masks [I, N] / [I, M] (True = present) -> [I, N].

        Through the stock layers, absent tokens excluded as keys (``src_key_padding_mask``); fitting
        differentiates this function with autograd."""
        n_mem = memory.shape[1]
        h = self._embed(beam, memory)
        pad = ~torch.cat([memory_mask, beam_mask], dim=1).to(torch.bool)
        for layer in self.layers:
            h = layer(h, src_key_padding_mask=pad)
        return self.head(h[:, n_mem:]).squeeze(-1)

    def _embed(self, beam: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        n_mem = memory.shape[1]
        tokens = torch.cat([memory, beam], dim=1)
        roles = torch.cat(
            [
                torch.zeros(n_mem, dtype=torch.long, device=beam.device),
                torch.ones(beam.shape[1], dtype=torch.long, device=beam.device),
            ]
        )
        return self.w_in(tokens) + self.role(roles).unsqueeze(0)


@dataclass(frozen=True)
class HeadSpec:
    """One learned head: how to build, feed, fit and save it."""

    name: str
    cls: type[nn.Module]
    section: str  # the RerankCfg field holding its settings (lr, epochs, architecture)
    arch: tuple[str, ...]  # section fields that are constructor arguments (and must match saved heads)
    inputs: Callable[[BeamFeatures], tuple[torch.Tensor, ...]]  # the forward's arguments, per image
    chunk_images: int  # images per chunk when fitting on CPU (keeps a chunk's working set in cache)
    file: str  # weights file name in the heads directory
    check: Callable[[BeamFeatures, Any], None] | None = None  # raises when feats do not fit the config

    def settings(self, rerank: Any) -> Any:
        """This head's section of a RerankCfg."""
        return getattr(rerank, self.section)

    def build(self, section: Any) -> nn.Module:
        return self.cls(**{k: getattr(section, k) for k in self.arch})


HEADS: Registry[HeadSpec] = Registry("head")


def head_spec(head: nn.Module | str) -> HeadSpec:
    """The spec of a head module (by its class) or of a head name."""
    if isinstance(head, str):
        return HEADS.get(head)
    for _, spec in HEADS.items():
        if type(head) is spec.cls:
            return spec
    raise TypeError(f"unknown head type {type(head).__name__} (known: {', '.join(HEADS)})")


def _check_memory(feats: BeamFeatures, section: Any) -> None:
    if feats.memory.shape[1] != section.memory_tokens:
        raise ValueError(
            f"fit_memattend: features carry {feats.memory.shape[1]} memory tokens but "
            f"rerank.memattend.memory_tokens = {section.memory_tokens}; load the features with "
            f"memory_tokens={section.memory_tokens}"
        )


HEADS.add(
    "trifuse",
    HeadSpec(
        name="trifuse",
        cls=TriFuse,
        section="trifuse",
        arch=("hidden",),
        inputs=lambda f: (f.scores,),
        chunk_images=2500,
        file="trifuse.safetensors",
    ),
)
HEADS.add(
    "memattend",
    HeadSpec(
        name="memattend",
        cls=MemAttend,
        section="memattend",
        arch=("d_model", "layers", "heads", "ffn"),
        inputs=lambda f: (f.beam, f.memory, f.mask, f.memory_mask),
        chunk_images=256,
        file="memattend.safetensors",
        check=_check_memory,
    ),
)


@dataclass
class Heads:
    """Fitted heads (either may be None) with their per-epoch training losses and fit metadata."""

    trifuse: TriFuse | None = None
    memattend: MemAttend | None = None
    losses: dict[str, list[float]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def available(self) -> list[str]:
        """Names of the heads present, in registry order."""
        return [n for n in HEADS if getattr(self, n, None) is not None]

    def get(self, name: str) -> nn.Module | None:
        return getattr(self, HEADS.get(name).name, None)

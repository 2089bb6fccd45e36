"""The LM judge of a candidates file without log-probs (``captioner.candidates.lm``): a text-only causal
language model (GPT-2 by default; any transformers ``AutoModelForCausalLM``) scoring each caption as
log p(caption tokens, stop token | start token), the same quantities a captioner's beam reports: the
sum, the mean and the token count (the caption's tokens and the stop token)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from adjcap.models.precision import pick_device
from adjcap.models.sources import ModelUnavailableError, hub_or_dir


@dataclass
class TextLM:
    model: Any  # None: the tokenizer alone (token counts only)
    tokenizer: Any
    model_id: str
    device: torch.device

    def ids(self, text: str) -> list[int]:
        """The caption's tokens and the stop token."""
        return [*self.tokenizer(text, add_special_tokens=False)["input_ids"], self.stop_id]

    @property
    def stop_id(self) -> int:
        t = self.tokenizer
        return t.eos_token_id if t.eos_token_id is not None else t.sep_token_id

    @property
    def start_id(self) -> int:
        t = self.tokenizer
        return next(x for x in (t.bos_token_id, t.cls_token_id, t.eos_token_id) if x is not None)

    def count(self, texts: Sequence[str]) -> list[int]:
        return [len(self.ids(t)) for t in texts]

    def score(self, texts: Sequence[str], batch_size: int = 32) -> list[tuple[float, int]]:
        """(log-prob sum, token count) of each text, in order (padded batches; each row's own tokens only)."""
        if self.model is None:
            raise ValueError(f"{self.model_id}: loaded as a tokenizer only")
        out: list[tuple[float, int]] = []
        for start in range(0, len(texts), batch_size):
            seqs = [[self.start_id, *self.ids(t)] for t in texts[start : start + batch_size]]
            width = max(len(s) for s in seqs)
            ids = torch.tensor([s + [0] * (width - len(s)) for s in seqs], dtype=torch.long, device=self.device)
            mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs], device=self.device)
            with torch.inference_mode():
                logits = self.model(input_ids=ids, attention_mask=mask).logits.float()
                logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
            for row, s in zip(logp, seqs):
                n = len(s) - 1
                out.append((float(row[:n].double().sum()), n))
        return out


def load_text_lm(spec: str | os.PathLike, *, device: str | torch.device = "auto", tokenizer_only: bool = False,
                 cache_dir: str | None = None) -> TextLM:
    """A causal LM and its tokenizer from a hub id or a ``save_pretrained`` directory (fp32: the judge's
    numbers are features)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    needs = (("tokenizer.json",), ("vocab.json",), ("vocab.txt",)) if tokenizer_only else (("config.json",),)
    src = hub_or_dir(spec, what="LM judge", config_key="captioner.candidates.lm", needs=needs, cache_dir=cache_dir)
    dev = pick_device(device)
    kw = dict(cache_dir=cache_dir, local_files_only=src.local_only)
    try:
        tok = AutoTokenizer.from_pretrained(src.source, **kw)
        net = None if tokenizer_only else AutoModelForCausalLM.from_pretrained(src.source, dtype=torch.float32, **kw)
    except OSError as e:
        raise ModelUnavailableError(
            f"LM judge '{src.source}' could not be loaded ({str(e).splitlines()[0]}): download it with "
            f"`huggingface-cli download {src.source} --local-dir DIR` and set captioner.candidates.lm=DIR") from e
    if net is not None:
        net.to(dev).eval()
    return TextLM(net, tok, src.model_id, dev)

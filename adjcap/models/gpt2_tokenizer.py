"""GPT-2 byte-level BPE tokenizer: loading from a Hugging Face id or a local directory (offline-safe),
and IFCap's stop-token set."""

from __future__ import annotations

import os
from collections.abc import Iterable

from adjcap.models.sources import hub_or_dir

ENDOFTEXT = "<|endoftext|>"

__all__ = ["ENDOFTEXT", "TokenizerLoadError", "load_gpt2_tokenizer", "stop_token_ids"]


class TokenizerLoadError(OSError):
    """The GPT-2 tokenizer could not be loaded; the message says where to get it."""


def load_gpt2_tokenizer(name_or_dir: str | os.PathLike = "gpt2"):
    """A GPT-2 BPE tokenizer from a local directory (``tokenizer.json`` or ``vocab.json`` +
    ``merges.txt``) or a Hugging Face hub id (``gpt2``), honouring ``HF_HUB_OFFLINE``."""
    from transformers import AutoTokenizer, GPT2TokenizerFast

    src = hub_or_dir(name_or_dir, what="GPT-2 tokenizer", config_key="captioner.tokenizer",
                     needs=(("tokenizer.json",), ("vocab.json", "merges.txt")), error=TokenizerLoadError)
    try:
        if src.is_dir:
            return GPT2TokenizerFast.from_pretrained(src.source)
        return AutoTokenizer.from_pretrained(src.source, local_files_only=src.local_only)
    except Exception as e:  # noqa: BLE001 - hub/offline errors come in many types
        raise TokenizerLoadError(
            f"could not load the GPT-2 tokenizer '{src.source}': {e}. Download it once on a machine with access "
            f"(`huggingface-cli download gpt2 tokenizer.json vocab.json merges.txt --local-dir DIR`) "
            "and set captioner.tokenizer=DIR."
        ) from e


def stop_token_ids(tokenizer, stops: Iterable[str] = (".", " .")) -> tuple[int, ...]:
    """IFCap's stop set: the *last* token id of each encoded stop string (13 and 764 for GPT-2)."""
    out: list[int] = []
    for s in stops:
        ids = tokenizer.encode(s, add_special_tokens=False)
        if not ids:
            raise ValueError(f"the tokenizer encodes the stop string {s!r} to nothing")
        if ids[-1] not in out:
            out.append(int(ids[-1]))
    return tuple(out)

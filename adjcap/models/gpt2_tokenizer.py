"""GPT-2 byte-level BPE tokenizer: loading (HF id or local directory, offline-safe) and training a
tiny GPT-2-style tokenizer on a corpus for the tiny-model world."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

ENDOFTEXT = "<|endoftext|>"

__all__ = ["ENDOFTEXT", "TokenizerLoadError", "load_gpt2_tokenizer", "stop_token_ids", "train_gpt2_tokenizer"]


class TokenizerLoadError(OSError):
    """The GPT-2 tokenizer could not be loaded; the message says where to get it."""


def load_gpt2_tokenizer(name_or_dir: str | os.PathLike = "gpt2"):
    """A GPT-2 BPE tokenizer from a local directory (``tokenizer.json`` or ``vocab.json`` +
    ``merges.txt``) or a Hugging Face hub id (``gpt2``), honouring ``HF_HUB_OFFLINE``."""
    from transformers import AutoTokenizer, GPT2TokenizerFast

    p = Path(os.path.expanduser(str(name_or_dir)))
    if p.is_dir():
        if not ((p / "tokenizer.json").exists() or ((p / "vocab.json").exists() and (p / "merges.txt").exists())):
            raise TokenizerLoadError(
                f"{p} holds no GPT-2 tokenizer: expected tokenizer.json or vocab.json + merges.txt. "
                "Copy the files of the Hugging Face 'gpt2' tokenizer there "
                "(e.g. `huggingface-cli download gpt2 tokenizer.json vocab.json merges.txt --local-dir DIR`)."
            )
        try:
            return GPT2TokenizerFast.from_pretrained(str(p))
        except Exception as e:  # noqa: BLE001 - re-raised with the path
            raise TokenizerLoadError(f"could not load the GPT-2 tokenizer in {p}: {e}") from e
    if p.suffix or os.sep in str(name_or_dir) or str(name_or_dir).startswith("."):
        raise TokenizerLoadError(
            f"GPT-2 tokenizer directory {p} does not exist. Point captioner.tokenizer at a directory with "
            "tokenizer.json (or vocab.json + merges.txt), or use the hub id 'gpt2'."
        )
    try:
        return AutoTokenizer.from_pretrained(str(name_or_dir))
    except Exception as e:  # noqa: BLE001 - hub/offline errors come in many types
        offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
        raise TokenizerLoadError(
            f"could not load the GPT-2 tokenizer '{name_or_dir}' from the Hugging Face hub"
            f"{' (HF_HUB_OFFLINE is set)' if offline else ''}: {e}. Download it once on a machine with access "
            f"(`huggingface-cli download {name_or_dir} tokenizer.json vocab.json merges.txt --local-dir DIR`) "
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


def train_gpt2_tokenizer(texts: Iterable[str], out_dir: str | os.PathLike, vocab_size: int = 512) -> Path:
    """Train a GPT-2-style byte-level BPE (no prefix space, ``<|endoftext|>`` as bos/eos/unk) on
    ``texts`` and save it so that ``GPT2TokenizerFast.from_pretrained(out_dir)`` loads it.
    The 256 byte symbols are always in the vocabulary, so "." is a token."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import GPT2TokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    texts = [t for t in texts if t]
    if not texts:
        raise ValueError("train_gpt2_tokenizer needs at least one non-empty text")
    bpe = ByteLevelBPETokenizer(add_prefix_space=False)
    bpe.train_from_iterator(
        texts, vocab_size=max(vocab_size, 257), min_frequency=2, special_tokens=[ENDOFTEXT], show_progress=False
    )
    bpe.save_model(str(out))  # vocab.json + merges.txt
    hf = GPT2TokenizerFast(
        tokenizer_object=bpe._tokenizer, bos_token=ENDOFTEXT, eos_token=ENDOFTEXT, unk_token=ENDOFTEXT
    )
    hf.model_max_length = 1024
    hf.save_pretrained(str(out))
    return out

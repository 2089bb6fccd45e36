"""The tiny BLIP ITM verifier: a small ``BlipForImageTextRetrieval`` with a WordPiece tokenizer
trained on the corpus (BLIP's [DEC] and [ENC] appended as in LAVIS), saved with ``save_pretrained``
so :func:`adjcap.models.blip.load_verifier` loads the directory exactly like a hub id."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from adjcap.models.blip import quiet_progress


def train_wordpiece_tokenizer(corpus_texts: Sequence[str], vocab_size: int = 1000) -> Any:
    """A lower-casing BERT WordPiece tokenizer whose vocabulary is learnt from ``corpus_texts``, with
    BLIP's [DEC] (bos) and [ENC] tokens appended after it as in LAVIS.

    The text is normalised and pre-tokenised with the ``tokenizers`` library's BERT normaliser and
    pre-tokeniser; the vocabulary is the special tokens, every character (and its ``##`` form, ASCII
    always included), then whole words by frequency (ties alphabetical) up to ``vocab_size``. (The
    library's WordPieceTrainer breaks frequency ties differently from run to run; this is
    deterministic, so the tiny world is reproducible.)
    """
    import string
    from collections import Counter

    from tokenizers import normalizers, pre_tokenizers
    from transformers import BertTokenizer

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    norm = normalizers.BertNormalizer(lowercase=True)
    pre = pre_tokenizers.BertPreTokenizer()
    counts: Counter[str] = Counter()
    for text in corpus_texts:
        for word, _ in pre.pre_tokenize_str(norm.normalize_str(text)):
            counts[word] += 1
    chars = sorted({c for w in counts for c in w} | set(string.ascii_lowercase + string.digits + string.punctuation))
    tokens = specials + chars + ["##" + c for c in chars]
    words = sorted((w for w in counts if len(w) > 1), key=lambda w: (-counts[w], w))
    tokens += words[: max(0, vocab_size - len(tokens))]
    tok = BertTokenizer(vocab={t: i for i, t in enumerate(tokens)}, do_lower_case=True)
    tok.add_special_tokens({"bos_token": "[DEC]"})
    tok.add_tokens(["[ENC]"], special_tokens=True)
    tok.model_max_length = 512
    return tok


def build_tiny_blip(
    out_dir: str | os.PathLike,
    corpus_texts: Sequence[str],
    seed: int = 42,
    image_size: int = 32,
    patch_size: int = 8,
    hidden: int = 32,
    layers: int = 2,
    vocab_size: int = 1000,
) -> Path:
    """Save a tiny ``BlipForImageTextRetrieval`` (random, deterministic) with a WordPiece tokenizer
    trained on ``corpus_texts`` and a matching image processor into ``out_dir``; it loads with
    ``load_verifier(str(out_dir))`` exactly like a hub id."""
    from transformers import BlipConfig, BlipForImageTextRetrieval, BlipImageProcessor
    from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

    if not corpus_texts:
        raise ValueError("build_tiny_blip needs corpus texts to train its tokenizer")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = train_wordpiece_tokenizer(corpus_texts, vocab_size=vocab_size)
    dec_id = tok.convert_tokens_to_ids("[DEC]")
    enc_id = tok.convert_tokens_to_ids("[ENC]")
    assert enc_id == dec_id + 1 == len(tok) - 1, (dec_id, enc_id, len(tok))
    heads = max(1, hidden // 16)
    config = BlipConfig(
        text_config=dict(
            vocab_size=len(tok),
            hidden_size=hidden,
            encoder_hidden_size=hidden,
            intermediate_size=hidden * 2,
            projection_dim=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            max_position_embeddings=64,
            bos_token_id=dec_id,
            pad_token_id=tok.pad_token_id,
            sep_token_id=tok.sep_token_id,
            eos_token_id=tok.sep_token_id,
            initializer_range=0.2,
        ),
        vision_config=dict(
            hidden_size=hidden,
            intermediate_size=hidden * 2,
            projection_dim=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            image_size=image_size,
            patch_size=patch_size,
            initializer_range=0.2,
        ),
        image_text_hidden_size=hidden // 2,
        projection_dim=hidden // 2,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = BlipForImageTextRetrieval(config)
        # spread the ITM head so random scores cover (0, 1) instead of sitting at 0.5
        torch.nn.init.normal_(net.itm_head.weight, std=2.0 / math.sqrt(hidden))
    net.eval()
    with quiet_progress():
        net.save_pretrained(out)
    processor = BlipImageProcessor(
        do_resize=True,
        size={"height": image_size, "width": image_size},
        resample=3,  # bicubic, as BLIP / LAVIS
        do_rescale=True,
        do_normalize=True,
        image_mean=OPENAI_CLIP_MEAN,
        image_std=OPENAI_CLIP_STD,
        do_convert_rgb=True,
    )
    processor.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "adjcap_tiny.json").write_text(json.dumps({"family": "blip-itm", "seed": seed}) + "\n")
    return out

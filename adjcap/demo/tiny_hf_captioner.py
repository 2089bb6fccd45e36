"""Tiny transformers captioners of the ``hf`` family's classes: ``BlipForConditionalGeneration``,
``GitForCausalLM`` and ``VisionEncoderDecoderModel`` (ViT + GPT-2 with cross-attention), each with a
WordPiece tokenizer trained on the corpus and an image processor, saved with ``save_pretrained`` so
:func:`adjcap.models.hf_captioner.load_hf_captioner` loads the directory exactly like a hub id."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import torch

from adjcap.demo.tiny_blip import train_wordpiece_tokenizer
from adjcap.models.blip import quiet_progress

KINDS = ("blip", "git", "vision-encoder-decoder")


def _config(kind: str, tok, image_size: int, patch_size: int, hidden: int, layers: int):
    from transformers import (BlipConfig, GitConfig, GPT2Config, ViTConfig,
                              VisionEncoderDecoderConfig)

    heads = max(1, hidden // 16)
    cls, sep, pad = tok.cls_token_id, tok.sep_token_id, tok.pad_token_id
    vision = dict(hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
                  num_attention_heads=heads, image_size=image_size, patch_size=patch_size)
    if kind == "blip":
        bos = tok.convert_tokens_to_ids("[DEC]")
        return BlipConfig(
            text_config=dict(vocab_size=len(tok), hidden_size=hidden, encoder_hidden_size=hidden,
                             intermediate_size=hidden * 2, num_hidden_layers=layers, num_attention_heads=heads,
                             max_position_embeddings=64, bos_token_id=bos, pad_token_id=pad, sep_token_id=sep,
                             eos_token_id=sep, initializer_range=0.2),
            vision_config={**vision, "projection_dim": hidden}, projection_dim=hidden // 2,
            image_text_hidden_size=hidden // 2)
    if kind == "git":
        return GitConfig(vision_config={**vision, "projection_dim": hidden}, vocab_size=len(tok), hidden_size=hidden,
                         intermediate_size=hidden * 2, num_hidden_layers=layers, num_attention_heads=heads,
                         max_position_embeddings=64, bos_token_id=cls, eos_token_id=sep, pad_token_id=pad,
                         initializer_range=0.2)
    dec = GPT2Config(vocab_size=len(tok), n_positions=64, n_embd=hidden, n_layer=layers, n_head=heads,
                     add_cross_attention=True, is_decoder=True, bos_token_id=cls, eos_token_id=sep,
                     pad_token_id=pad, decoder_start_token_id=cls, initializer_range=0.2)
    cfg = VisionEncoderDecoderConfig.from_encoder_decoder_configs(ViTConfig(**vision), dec)
    cfg.decoder_start_token_id, cfg.pad_token_id, cfg.eos_token_id = cls, pad, sep
    return cfg


def build_tiny_hf_captioner(out_dir: str | os.PathLike, kind: str, corpus_texts: Sequence[str], seed: int = 42,
                            image_size: int = 32, patch_size: int = 8, hidden: int = 32, layers: int = 2,
                            vocab_size: int = 1000, eos_bias: float = 0.0) -> Path:
    """Save a tiny random (deterministic) captioner of ``kind`` (a key of ``hf_captioner.CLASSES``);
    ``eos_bias`` is added to the stop token's output bias where the output layer has one (BLIP, GIT), so
    a random model's beams finish before ``max_len`` too."""
    import transformers
    from transformers import BlipImageProcessor, GenerationConfig
    from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

    from adjcap.models.hf_captioner import CLASSES

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = train_wordpiece_tokenizer(corpus_texts, vocab_size=vocab_size)
    config = _config(kind, tok, image_size, patch_size, hidden, layers)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = getattr(transformers, CLASSES[kind])(config)
    net.eval()
    eos = tok.sep_token_id
    head = net.text_decoder.get_output_embeddings() if kind == "blip" else net.get_output_embeddings()
    if eos_bias and getattr(head, "bias", None) is not None:
        with torch.no_grad():
            head.bias[eos] += eos_bias
    bos = tok.convert_tokens_to_ids("[DEC]") if kind == "blip" else tok.cls_token_id
    net.generation_config = GenerationConfig(bos_token_id=bos, eos_token_id=eos, pad_token_id=tok.pad_token_id,
                                             decoder_start_token_id=tok.cls_token_id if kind != "git" else None)
    with quiet_progress():
        net.save_pretrained(out)
    BlipImageProcessor(do_resize=True, size={"height": image_size, "width": image_size}, resample=3,
                       do_rescale=True, do_normalize=True, image_mean=OPENAI_CLIP_MEAN, image_std=OPENAI_CLIP_STD,
                       do_convert_rgb=True).save_pretrained(out)
    tok.save_pretrained(out)
    (out / "adjcap_tiny.json").write_text(json.dumps({"family": f"hf-{kind}", "seed": seed}) + "\n")
    return out

"""Tiny random vision-language models of the ``vlm`` family's classes, saved like a hub snapshot (config,
weights, processor with its tokenizer and chat template) so :func:`adjcap.models.vlm_captioner.load_vlm`
loads the directory exactly as it loads ``llava-hf/llava-1.5-7b-hf``:

* ``llava``: ``LlavaForConditionalGeneration`` (CLIP vision tower + Llama) with ``LlavaProcessor``;
* ``qwen2_vl``: ``Qwen2VLForConditionalGeneration`` with ``Qwen2VLProcessor`` (its own image processor);
* ``idefics3``: ``Idefics3ForConditionalGeneration`` (SmolVLM's class) with ``Idefics3Processor``.

The tokenizer is a WordPiece vocabulary learnt from a corpus (every character, then words by frequency:
:func:`adjcap.demo.tiny_blip.train_wordpiece_tokenizer`'s vocabulary) with the chat and image tokens of
each class as special tokens and no post-processor (no [CLS]/[SEP] added), so the prompt the processor
tokenizes is the chat template's text, as a real checkpoint's is.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import torch

KINDS = ("llava", "qwen2_vl", "idefics3")
CLASSES = {"llava": "LlavaForConditionalGeneration", "qwen2_vl": "Qwen2VLForConditionalGeneration",
           "idefics3": "Idefics3ForConditionalGeneration"}
SPECIALS = ["<pad>", "<unk>", "<s>", "<|im_start|>", "<|im_end|>", "<image>", "<|image_pad|>", "<|vision_start|>",
            "<|vision_end|>", "<fake_token_around_image>", "<global-img>", "<end_of_utterance>"]
# the classes' chat templates, cut down: the user turn's image and text parts, then the assistant's start
TEMPLATES = {
    "llava": "{% for m in messages %}{{ m['role'].upper() }}: {% for c in m['content'] %}{% if c['type'] == 'image' %}"
             "<image>\n{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %} {% endfor %}"
             "{% if add_generation_prompt %}ASSISTANT:{% endif %}",
    "qwen2_vl": "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% for c in m['content'] %}"
                "{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>{% elif c['type'] == 'text' %}"
                "{{ c['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    "idefics3": "<|im_start|>{% for m in messages %}{{ m['role'] | capitalize }}:{% for c in m['content'] %}"
                "{% if c['type'] == 'image' %}<image>{% elif c['type'] == 'text' %} {{ c['text'] }}{% endif %}"
                "{% endfor %}<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}Assistant:{% endif %}",
}
EOS = {"llava": "<|im_end|>", "qwen2_vl": "<|im_end|>", "idefics3": "<end_of_utterance>"}
PROMPT_WORDS = ("user assistant please describe this image in detail . provide a one - sentence caption for the "
                "provided : ?")


def tiny_tokenizer(corpus_texts: Sequence[str], vocab_size: int = 600):
    """A fast WordPiece tokenizer (lower-casing, BERT pre-tokenizer, ``##`` decoder) over ``corpus_texts``
    and the protocol prompts' words, with :data:`SPECIALS`; nothing added around a text."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from adjcap.demo.tiny_blip import train_wordpiece_tokenizer

    words = train_wordpiece_tokenizer([*corpus_texts, PROMPT_WORDS], vocab_size=vocab_size).get_vocab()
    vocab = {t: i for i, t in enumerate(SPECIALS)}
    for t, _ in sorted(words.items(), key=lambda kv: kv[1]):
        if not (t.startswith("[") and t.endswith("]")):
            vocab.setdefault(t, len(vocab))
    core = Tokenizer(models.WordPiece(vocab, unk_token="<unk>"))
    core.normalizer = normalizers.BertNormalizer(lowercase=True)
    core.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    core.decoder = decoders.WordPiece()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", pad_token="<pad>", bos_token="<s>",
                                  additional_special_tokens=SPECIALS[3:])
    tok.model_max_length = 4096
    return tok


def _text(tok, hidden: int, layers: int, eos: int) -> dict:
    return dict(vocab_size=len(tok), hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096, bos_token_id=tok.bos_token_id,
                eos_token_id=eos, pad_token_id=tok.pad_token_id, tie_word_embeddings=False, initializer_range=0.2)


def _build(kind: str, tok, image_size: int, hidden: int, layers: int, eos: int):
    """(model config, processor) of ``kind``."""
    import transformers as tf
    from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

    ids = tok.convert_tokens_to_ids
    text = _text(tok, hidden, layers, eos)
    if kind == "llava":
        patch = 8
        vision = dict(hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers, num_attention_heads=4,
                      image_size=image_size, patch_size=patch, projection_dim=hidden)
        cfg = tf.LlavaConfig(vision_config={"model_type": "clip_vision_model", **vision},
                             text_config={"model_type": "llama", **text}, image_token_id=ids("<image>"),
                             vision_feature_layer=-2, vision_feature_select_strategy="default")
        proc = tf.LlavaProcessor(
            image_processor=tf.CLIPImageProcessor(size={"shortest_edge": image_size},
                                                  crop_size={"height": image_size, "width": image_size},
                                                  image_mean=OPENAI_CLIP_MEAN, image_std=OPENAI_CLIP_STD),
            tokenizer=tok, patch_size=patch, vision_feature_select_strategy="default", image_token="<image>",
            num_additional_image_tokens=1, chat_template=TEMPLATES[kind])
        return cfg, proc
    if kind == "qwen2_vl":
        patch, merge = 4, 2
        head = hidden // 4
        cfg = tf.Qwen2VLConfig(
            text_config={**text, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                     "mrope_section": [head // 4, head // 8, head // 8]}},
            vision_config=dict(depth=layers, embed_dim=hidden, hidden_size=hidden, num_heads=4, mlp_ratio=2,
                               patch_size=patch, spatial_merge_size=merge, temporal_patch_size=2, in_channels=3),
            image_token_id=ids("<|image_pad|>"), vision_start_token_id=ids("<|vision_start|>"),
            vision_end_token_id=ids("<|vision_end|>"))
        side = image_size
        proc = tf.Qwen2VLProcessor(
            image_processor=tf.Qwen2VLImageProcessor(patch_size=patch, merge_size=merge, temporal_patch_size=2,
                                                     size={"shortest_edge": (side // 2) ** 2,
                                                           "longest_edge": side * side}),
            tokenizer=tok, video_processor=tf.Qwen2VLVideoProcessor(patch_size=patch, merge_size=merge),
            chat_template=TEMPLATES[kind])
        return cfg, proc
    patch, scale = 8, 2
    cfg = tf.Idefics3Config(
        vision_config=dict(hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
                           num_attention_heads=4, image_size=image_size, patch_size=patch),
        text_config={"model_type": "llama", **text}, scale_factor=scale, image_token_id=ids("<image>"),
        tie_word_embeddings=False)
    seq = (image_size // patch) ** 2 // scale ** 2
    proc = tf.Idefics3Processor(
        image_processor=tf.Idefics3ImageProcessor(do_image_splitting=False, size={"longest_edge": image_size},
                                                  max_image_size={"longest_edge": image_size}),
        tokenizer=tok, image_seq_len=seq, chat_template=TEMPLATES[kind])
    return cfg, proc


def build_tiny_vlm(out_dir: str | os.PathLike, kind: str, corpus_texts: Sequence[str], seed: int = 42,
                   image_size: int = 32, hidden: int = 32, layers: int = 2, eos_bias: float = 0.0) -> Path:
    """Save a tiny random (deterministic) vision-language model of ``kind`` (a key of :data:`CLASSES`) with
    its processor; ``eos_bias`` is added to the stop token's row of the output layer's weights' bias
    stand-in (the last hidden unit's weight), so a random model's candidates stop before the limit too."""
    import transformers
    from transformers import GenerationConfig

    from adjcap.models.blip import quiet_progress

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = tiny_tokenizer(corpus_texts)
    eos = tok.convert_tokens_to_ids(EOS[kind])
    tok.eos_token = EOS[kind]
    cfg, proc = _build(kind, tok, image_size, hidden, layers, eos)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = getattr(transformers, CLASSES[kind])(cfg)
    net.eval()
    if eos_bias:
        with torch.no_grad():
            net.get_output_embeddings().weight[eos] += eos_bias / max(1, hidden) ** 0.5
    net.generation_config = GenerationConfig(bos_token_id=tok.bos_token_id, eos_token_id=eos,
                                             pad_token_id=tok.pad_token_id)
    with quiet_progress():
        net.save_pretrained(out)
    proc.save_pretrained(out)
    (out / "adjcap_tiny.json").write_text(json.dumps({"family": f"vlm-{kind}", "seed": seed}) + "\n")
    return out


FOLDER = "vlm-llava"  # under {cache}/tiny: the demo mapping's captioner.vlm.model
READY = "READY.json"


def ensure_tiny_vlm(cache: str | os.PathLike, corpus_texts: Sequence[str], seed: int = 42) -> Path:
    """``{cache}/tiny/vlm-llava``: the demo's tiny random LLaVA, built on first use by the runs that caption
    with it (``reproduce lvlm-chair --benchmark demo``; never ``make demo``), under a lock, then reused.
    Untrained: its candidates are the corpus's words in random order, so on the demo world the table shows
    the machinery (rows, intervals, cut counts), not a model's hallucination."""
    from adjcap.storage.file_lock import holding
    from adjcap.storage.io import atomic_write_json

    out = Path(cache) / "tiny" / FOLDER
    if (out / READY).is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with holding(out.parent / f".{FOLDER}.lock", wait=True):
        if not (out / READY).is_file():
            build_tiny_vlm(out, "llava", corpus_texts, seed=seed, image_size=32, hidden=32, layers=2, eos_bias=4.0)
            atomic_write_json(out / READY, {"kind": "llava", "seed": seed, "trained": False})
    return out

"""The tiny IFCap captioner: a GPT-2-style byte-level BPE tokenizer trained on the corpus, and an IFCap
of the real classes at small widths saved like the released files (a plain state dict with the official
key names and the GPT-2 mask buffers transformers 4.19 stored), so
:func:`adjcap.models.ifcap.load_ifcap` loads it unchanged."""

from __future__ import annotations

import json
import math
import os
import re
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch

from adjcap.models.gpt2_tokenizer import ENDOFTEXT, load_gpt2_tokenizer, stop_token_ids
from adjcap.models.ifcap import ClipCaptionModel, MappingDims


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


def gpt2_mask_buffers(n_positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The two per-layer buffers transformers 4.19 stored in GPT-2 state dicts."""
    bias = torch.tril(torch.ones(n_positions, n_positions, dtype=torch.uint8)).view(1, 1, n_positions, n_positions)
    return bias, torch.tensor(-1e4)


def with_gpt2_mask_buffers(sd: Mapping[str, torch.Tensor], n_layer: int, n_positions: int) -> OrderedDict:
    """A state dict laid out like the released files: mask buffers inserted after each ln_1."""
    bias, masked = gpt2_mask_buffers(n_positions)
    out: OrderedDict[str, torch.Tensor] = OrderedDict()
    for k, v in sd.items():
        out[k] = v
        m = re.match(r"^gpt\.transformer\.h\.(\d+)\.ln_1\.bias$", k)
        if m and int(m.group(1)) < n_layer:
            out[f"gpt.transformer.h.{m.group(1)}.attn.bias"] = bias
            out[f"gpt.transformer.h.{m.group(1)}.attn.masked_bias"] = masked
    return out


@torch.no_grad()
def captioner_like_init(
    model: ClipCaptionModel,
    stop_id: int,
    *,
    embed_std: float = 0.1,
    block_std: float | None = None,
    position_std: float = 0.1,
    stop_bias: float = 1.0,
    ln_f_scale: float = -1.0,
) -> None:
    """Re-initialise a random ClipCaptionModel so that its GPT-2 decodes like a captioner (see
    :func:`build_tiny_ifcap`); ``block_std`` defaults to 2/sqrt(n_embd). Uses the global RNG."""
    tr = model.gpt.transformer
    d = tr.wte.weight.shape[1]
    block_std = 2.0 / math.sqrt(d) if block_std is None else block_std
    tr.wte.weight.normal_(0.0, embed_std)
    tr.wpe.weight.normal_(0.0, position_std)
    for block in tr.h:
        for mod in (block.attn.c_attn, block.attn.c_proj, block.mlp.c_fc, block.mlp.c_proj):
            mod.weight.normal_(0.0, block_std)
    stop = tr.wte.weight[stop_id]
    tr.ln_f.weight.fill_(ln_f_scale)
    tr.ln_f.bias.copy_(stop_bias * stop / stop.norm() ** 2)
    model.mapping_network.prefix_const.normal_(0.0, 1.0 / math.sqrt(d))


def build_tiny_ifcap(
    out_dir: str | os.PathLike,
    tokenizer_dir: str | os.PathLike,
    clip_dim: int,
    seed: int = 42,
    *,
    n_embd: int = 32,
    n_layer: int = 2,
    n_head: int = 2,
    n_positions: int = 128,
    mapping_layers: int = 2,
    mapping_heads: int = 2,
    embed_std: float = 0.1,
    block_std: float = 0.35,
    position_std: float = 0.1,
    stop_bias: float = 1.0,
    ln_f_scale: float = -1.0,
) -> Path:
    """A tiny IFCap of the real classes with random deterministic weights, saved like the released
    files (plain state dict with the official key names, GPT-2 mask buffers included):
    ``out_dir/tiny-ifcap.pt`` + ``out_dir/config.json`` (its GPT-2 config). Returns the .pt path.

    The init is chosen so that the random tiny LM decodes like a captioner instead of repeating
    one token or stopping at once: token embeddings ``embed_std``, GPT-2 block matrices ``block_std``
    (instead of GPT-2's 0.02, so the blocks, not the tied input embedding, drive the next token),
    position embeddings ``position_std``, ``ln_f.weight = ln_f_scale`` (negative: the tied head does
    not copy the last token) and ``ln_f.bias`` raising the logit of "." by ``stop_bias``. The result
    is a mix of short and long captions, early stops and beams that run to max_len."""
    from transformers import GPT2Config

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = load_gpt2_tokenizer(tokenizer_dir)
    cfg = GPT2Config(
        vocab_size=len(tok),
        n_positions=n_positions,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        activation_function="gelu_new",
        layer_norm_epsilon=1e-5,
        bos_token_id=tok.eos_token_id,
        eos_token_id=tok.eos_token_id,
        tie_word_embeddings=True,
    )
    dims = MappingDims(
        clip_dim=clip_dim,
        d_model=n_embd,
        clip_project_length=10,
        prefix_length=10,
        num_layers=mapping_layers,
        cross_layers=1,
        mlp_hidden=2 * n_embd,
    )
    gen_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = ClipCaptionModel(cfg, dims, mapping_heads)
        captioner_like_init(
            model,
            stop_token_ids(tok, (".",))[0],
            embed_std=embed_std,
            block_std=block_std,
            position_std=position_std,
            stop_bias=stop_bias,
            ln_f_scale=ln_f_scale,
        )
    finally:
        torch.random.set_rng_state(gen_state)
    sd = with_gpt2_mask_buffers(
        OrderedDict((k, v.detach().clone()) for k, v in model.state_dict().items()), n_layer, n_positions
    )
    # keep lm_head sharing wte's storage, as torch.save of the tied official model does
    sd["gpt.lm_head.weight"] = sd["gpt.transformer.wte.weight"]
    pt = out / "tiny-ifcap.pt"
    tmp = pt.with_suffix(".pt.tmp")
    torch.save(sd, tmp)
    os.replace(tmp, pt)
    cfg_dict = cfg.to_dict()
    cfg_dict["model_type"] = "gpt2"
    (out / "config.json").write_text(json.dumps(cfg_dict, indent=2, sort_keys=True))
    return pt

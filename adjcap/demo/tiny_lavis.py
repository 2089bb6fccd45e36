"""The tiny LAVIS BLIP ITM of the demo world under ``verifier.backend = "lavis"``.

LAVIS's ``BlipITM`` built with LAVIS's own classes (``adjcap.models.lavis_itm.build_lavis_itm``) at
a small size, random weights, saved as LAVIS saves a retrieval checkpoint (``{"model": state_dict}``
with some of the training state ITM never reads), beside a plain BERT WordPiece vocabulary (the demo
BLIP's, without [DEC]/[ENC], which LAVIS appends itself)::

    {cache}/tiny/blip-itm-lavis/model_tiny_retrieval.pth
    {cache}/tiny/blip-itm-lavis/bert-tokenizer/{vocab.txt, tokenizer_config.json}

Why random and not the trained tiny judge: the demo's trained BLIP has 16-wide attention heads, and a
LAVIS ``.pth`` holds no head count (LAVIS's BLIP models all use 64-wide heads, which is what both
backends read off a checkpoint). The model proves the backend end to end; its verdicts are noise.

:func:`build_tiny_lavis` runs in adjcap's environment and calls this module's ``build`` command with
the LAVIS environment's python; ``build`` imports only torch and :mod:`adjcap.models.lavis_itm`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TINY = dict(vision_width=128, vision_layers=2, vision_heads=2, vision_mlp=256, patch_size=8, image_size=32,
            text_width=128, text_layers=2, text_heads=2, text_intermediate=256, max_positions=64,
            encoder_width=128, embed_dim=32)
CHECKPOINT = "model_tiny_retrieval.pth"
TOKENIZER = "bert-tokenizer"
MARKER = "adjcap_tiny.json"
RECIPE = 2  # bump when build() changes: a cached checkpoint of another recipe is rebuilt


def build(out: str | os.PathLike, tokenizer: str | os.PathLike, seed: int) -> None:
    """(In the LAVIS environment.) A small LAVIS ``BlipITM`` with random weights saved to ``out``."""
    import torch
    from lavis.models.blip_models.blip import BlipBase

    from adjcap.models.lavis_itm import build_lavis_itm, lavis_tokenizer_source

    with lavis_tokenizer_source(str(tokenizer)):
        vocab = len(BlipBase.init_tokenizer())  # BERT vocabulary + [DEC] + [ENC]
    torch.manual_seed(seed)
    model = build_lavis_itm({**TINY, "vocab_size": vocab}, str(tokenizer)).eval()
    _spread(model, seed)
    sd = model.state_dict()
    # training state a released retrieval checkpoint carries and ITM does not read
    sd["temp"] = torch.tensor(0.07)
    sd["ptr_queue"] = torch.zeros(1, dtype=torch.long)
    sd["image_queue"] = torch.randn(TINY["embed_dim"], 8)
    sd["vision_proj_m.weight"] = torch.randn_like(sd["vision_proj.weight"])
    tmp = Path(f"{out}.tmp{os.getpid()}")
    torch.save({"model": sd}, tmp)
    os.replace(tmp, out)


def _spread(model, seed: int, logit_std: float = 2.0) -> None:
    """Make a random ITM's match probabilities cover (0, 1): at LAVIS's initialisation every caption of
    every image scores 0.55-0.58 (the [ENC] output barely depends on the text), so two captions often
    tie to 1e-5 and any float noise reorders them. Word embeddings at unit scale let the text move the
    output; the ITM head is then scaled and centred on probe pairs (seeded noise images, random
    vocabulary words) so the match logit has mean 0 and standard deviation ``logit_std``."""
    import torch

    g = torch.Generator().manual_seed(seed)
    emb = model.text_encoder.embeddings.word_embeddings.weight
    with torch.no_grad():
        emb.copy_(torch.randn(emb.shape, generator=g))
        size = TINY["image_size"]
        images = model.visual_encoder.forward_features(torch.rand(8, 3, size, size, generator=g))
        words = [w for w in model.tokenizer.vocab if w.isalpha()]
        picks = torch.randint(len(words), (32, 8), generator=g).tolist()
        captions = [" ".join(words[i] for i in row) for row in picks]
        text = model.tokenizer(captions, padding="longest", truncation=True, max_length=35, return_tensors="pt")
        ids = text.input_ids.clone()
        ids[:, 0] = model.tokenizer.enc_token_id
        mem = images.repeat_interleave(4, dim=0)
        h = model.text_encoder(ids, attention_mask=text.attention_mask, encoder_hidden_states=mem,
                               encoder_attention_mask=torch.ones(mem.shape[:-1], dtype=torch.long),
                               return_dict=True).last_hidden_state[:, 0, :]
        head = model.itm_head
        d = h @ (head.weight[1] - head.weight[0]) + (head.bias[1] - head.bias[0])
        scale = logit_std / float(d.std())
        head.weight.mul_(scale)
        head.bias.mul_(scale)
        head.bias[1] -= scale * float(d.mean())


def write_bert_tokenizer(out_dir: Path, words: list[str]) -> Path:
    """A lower-casing BERT WordPiece vocabulary (``words``, [DEC]/[ENC] left out) in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    vocab = [w for w in words if w not in ("[DEC]", "[ENC]")]
    (out_dir / "vocab.txt").write_text("\n".join(vocab) + "\n")
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps({"do_lower_case": True, "tokenizer_class": "BertTokenizer"}) + "\n")
    return out_dir


def _vocabulary(tokenizer_dir: Path) -> list[str]:
    """The WordPiece vocabulary of a saved BERT tokenizer, in id order."""
    from transformers import AutoTokenizer

    vocab = AutoTokenizer.from_pretrained(str(tokenizer_dir)).get_vocab()
    return sorted(vocab, key=vocab.__getitem__)


def build_tiny_lavis(tiny_dir: Path, cache_dir: str | os.PathLike, seed: int = 42) -> tuple[Path, Path]:
    """(checkpoint, tokenizer dir) of the demo's tiny LAVIS ITM under ``tiny_dir/blip-itm-lavis``;
    built once with the LAVIS environment of ``cache_dir`` (which must be built), then reused."""
    from adjcap.models import lavis_env

    root = Path(tiny_dir) / "blip-itm-lavis"
    pth, tok = root / CHECKPOINT, root / TOKENIZER
    marker = root / MARKER
    want = {"family": "lavis-blip-itm", "seed": seed, "dims": TINY, "recipe": RECIPE}
    if pth.is_file() and marker.is_file() and json.loads(marker.read_text()) == want:
        return pth, tok
    write_bert_tokenizer(tok, _vocabulary(Path(tiny_dir) / "blip-itm"))
    py = lavis_env.env_python(cache_dir)
    env = {**os.environ, "PYTHONPATH": str(lavis_env.code_dir(cache_dir)), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([str(py), "-W", "ignore", "-m", "adjcap.demo.tiny_lavis", str(pth), str(tok), str(seed)],
                          capture_output=True, text=True, env=env)
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"{pth}: building the tiny LAVIS BLIP ITM in {py} failed: {last}")
    marker.write_text(json.dumps(want) + "\n")
    return pth, tok


if __name__ == "__main__":
    build(sys.argv[1], sys.argv[2], int(sys.argv[3]))

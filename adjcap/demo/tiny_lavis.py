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


def build(out: str | os.PathLike, tokenizer: str | os.PathLike, seed: int) -> None:
    """(In the LAVIS environment.) A small LAVIS ``BlipITM`` with random weights saved to ``out``."""
    import torch
    from lavis.models.blip_models.blip import BlipBase

    from adjcap.models.lavis_itm import build_lavis_itm, lavis_tokenizer_source

    with lavis_tokenizer_source(str(tokenizer)):
        vocab = len(BlipBase.init_tokenizer())  # BERT vocabulary + [DEC] + [ENC]
    torch.manual_seed(seed)
    model = build_lavis_itm({**TINY, "vocab_size": vocab}, str(tokenizer))
    # spread the ITM head so random scores cover (0, 1) instead of sitting at 0.5
    torch.nn.init.normal_(model.itm_head.weight, std=1.0 / TINY["text_width"] ** 0.5)
    sd = model.state_dict()
    # training state a released retrieval checkpoint carries and ITM does not read
    sd["temp"] = torch.tensor(0.07)
    sd["ptr_queue"] = torch.zeros(1, dtype=torch.long)
    sd["image_queue"] = torch.randn(TINY["embed_dim"], 8)
    sd["vision_proj_m.weight"] = torch.randn_like(sd["vision_proj.weight"])
    tmp = Path(f"{out}.tmp{os.getpid()}")
    torch.save({"model": sd}, tmp)
    os.replace(tmp, out)


def write_bert_tokenizer(out_dir: Path, words: list[str]) -> Path:
    """A lower-casing BERT WordPiece vocabulary (``words``, [DEC]/[ENC] left out) in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    vocab = [w for w in words if w not in ("[DEC]", "[ENC]")]
    (out_dir / "vocab.txt").write_text("\n".join(vocab) + "\n")
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps({"do_lower_case": True, "tokenizer_class": "BertTokenizer"}) + "\n")
    return out_dir


def build_tiny_lavis(tiny_dir: Path, cache_dir: str | os.PathLike, seed: int = 42) -> tuple[Path, Path]:
    """(checkpoint, tokenizer dir) of the demo's tiny LAVIS ITM under ``tiny_dir/blip-itm-lavis``;
    built once with the LAVIS environment of ``cache_dir`` (which must be built), then reused."""
    from adjcap import lavis_env

    root = Path(tiny_dir) / "blip-itm-lavis"
    pth, tok = root / CHECKPOINT, root / TOKENIZER
    marker = root / MARKER
    want = {"family": "lavis-blip-itm", "seed": seed, "dims": TINY}
    if pth.is_file() and marker.is_file() and json.loads(marker.read_text()) == want:
        return pth, tok
    words = (Path(tiny_dir) / "blip-itm" / "vocab.txt").read_text().splitlines()
    write_bert_tokenizer(tok, words)
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

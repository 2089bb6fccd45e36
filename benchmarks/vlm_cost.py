"""CPU cost per image of the vlm captioner family at a real checkpoint's size: SmolVLM-256M-Instruct's
shapes (Idefics3: SigLIP-B/16 at 512 px + SmolLM2-135M; counted in adjcap.models.budget.VLM_PARAMS) with
random weights (no hub here), one 512x512 image, one tile (no image splitting: 64 image tokens), through
adjcap.models.vlm_captioner (teacher-forced scores included): greedy and a beam of 5, ``--tokens`` new
tokens each (a random model never stops, so every candidate runs to the limit: seconds per new token is
the figure that transfers). Writes JSON with the command and the device.

    python benchmarks/vlm_cost.py --tokens 32 --threads 1 --json benchmarks/results/vlm-cost-cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image


def build_smolvlm_256m(out: Path) -> Path:
    import transformers as tf

    from adjcap.demo.tiny_vlm import TEMPLATES, tiny_tokenizer

    tok = tiny_tokenizer(["a dog on a bench next to a red car."])
    image_token = tok.convert_tokens_to_ids("<image>")
    cfg = tf.Idefics3Config(
        vision_config=dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                           image_size=512, patch_size=16),
        text_config=dict(model_type="llama", vocab_size=49280, hidden_size=576, intermediate_size=1536,
                         num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=False,
                         eos_token_id=tok.convert_tokens_to_ids("<end_of_utterance>"), pad_token_id=0),
        scale_factor=4, image_token_id=image_token, tie_word_embeddings=False)
    torch.manual_seed(0)
    net = tf.Idefics3ForConditionalGeneration(cfg).eval()
    net.generation_config = tf.GenerationConfig(eos_token_id=cfg.text_config.eos_token_id, pad_token_id=0)
    net.save_pretrained(out)
    tf.Idefics3Processor(image_processor=tf.Idefics3ImageProcessor(do_image_splitting=False,
                                                                   size={"longest_edge": 512},
                                                                   max_image_size={"longest_edge": 512}),
                         tokenizer=tok, image_seq_len=64, chat_template=TEMPLATES["idefics3"]).save_pretrained(out)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--beam", type=int, default=5)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: no spinning threads on a shared box)")
    a = ap.parse_args()
    from adjcap.models.budget import local_params
    from adjcap.models.vlm_captioner import load_vlm

    torch.set_num_threads(a.threads)
    with tempfile.TemporaryDirectory() as d:
        path = build_smolvlm_256m(Path(d) / "smolvlm")
        cap = load_vlm(str(path), device="cpu", precision="fp32")
        n = local_params(str(path))
        image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (480, 640, 3), dtype=np.uint8))
        cap.candidates(image, prompt="detail", n=1, max_new_tokens=2, search="greedy")  # warm-up
        out = {}
        for name, search, width in (("greedy", "greedy", 1), (f"beam{a.beam}", "beam", a.beam)):
            t = time.perf_counter()
            cands = cap.candidates(image, prompt="detail", n=width, max_new_tokens=a.tokens, search=search)
            s = time.perf_counter() - t
            out[name] = {"seconds_per_image": round(s, 2), "new_tokens": max(c.n_tokens for c in cands),
                         "seconds_per_new_token": round(s / a.tokens, 4)}
    doc = {"command": "python " + " ".join(sys.argv), "device": f"CPU {platform.processor() or platform.machine()}, "
           f"{torch.get_num_threads()} thread(s), a 2-core box shared with other jobs", "model": "SmolVLM-256M-Instruct shapes, random "
           "weights, 1 tile (64 image tokens), fp32", "parameters": n, "prompt": "detail", **out}
    print(json.dumps(doc, indent=1))
    if a.json:
        a.json.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""Throughput of the dual encoders, the caption index and the BLIP verifier.

    python benchmarks/encoders.py                 # tiny models on CPU (+ real sizes when CUDA is there)
    python benchmarks/encoders.py --real-only     # only the real-size architectures (needs CUDA)
    python benchmarks/encoders.py --json out.json

Tiny models are the project's own (``build_tiny_clip`` / ``build_tiny_blip``). Real sizes use random
weights of the real architectures (open_clip ``pretrained=None``; a ``BlipConfig`` shaped like
blip-itm-large), since no checkpoint can be downloaded here; speed does not depend on the weights.
Prints images/s and captions/s; nothing here is asserted.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from adjcap.index import CaptionIndex  # noqa: E402
from adjcap.demo.tiny_blip import build_tiny_blip, train_wordpiece_tokenizer  # noqa: E402
from adjcap.demo.tiny_clip import TINY_CLIP, build_tiny_clip  # noqa: E402
from adjcap.demo.world import random_images  # noqa: E402
from adjcap.models.blip import Verifier, load_verifier  # noqa: E402
from adjcap.models.clip import load_dual_encoder  # noqa: E402
from adjcap.models.precision import pick_dtype  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "data" / "coco_test_captions.json"
RESULTS: list[dict] = []


def captions(n: int) -> list[str]:
    """n COCO-like captions (the real test excerpt, cycled with small variations)."""
    base = [c.strip() for caps in json.loads(FIXTURE.read_text()).values() for c in caps]
    out = []
    i = 0
    while len(out) < n:
        c = base[i % len(base)]
        out.append(c if i < len(base) else f"{c} {base[(i * 7) % len(base)].split()[-1]}")
        i += 1
    return out


def timed(fn: Callable[[], object], device: torch.device, repeat: int = 3) -> float:
    fn()  # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t)
    return best


def report(section: str, what: str, n: int, unit: str, seconds: float, **extra) -> None:
    rate = n / seconds if seconds > 0 else float("inf")
    RESULTS.append({"section": section, "what": what, "n": n, "unit": unit, "seconds": seconds, "rate": rate, **extra})
    more = " ".join(f"{k}={v}" for k, v in extra.items())
    print(f"  {what:<44} {rate:>12.1f} {unit}/s   ({n} in {seconds * 1e3:8.1f} ms) {more}", flush=True)


def bench_dual_encoder(label: str, enc, n_images: int, n_texts: int) -> None:
    print(f"\n[{label}] {enc.model_id} on {enc.device} {enc.precision}, dim {enc.embed_dim}", flush=True)
    dev = enc.device
    if "image" in enc.towers:
        h, w = enc.image_size
        pixels = torch.randn(n_images, 3, h, w)
        report(label, "encode_images (preprocessed tensors)", n_images, "images", timed(lambda: enc.encode_images(pixels), dev))
        pil = random_images(min(n_images, 64), size=max(h, w) + 32, seed=1)
        report(label, "preprocess (PIL -> tensor, CPU)", len(pil), "images", timed(lambda: enc.preprocess(pil), dev, 1))
    if "text" in enc.towers:
        texts = captions(n_texts)
        tok = enc.tokenize(texts)
        mean_len = float(tok.lengths.float().mean())
        report(label, "tokenize (CPU)", n_texts, "captions", timed(lambda: enc.tokenize(texts), dev, 1))
        report(label, "encode_texts trimmed+bucketed (token ids)", n_texts, "captions",
               timed(lambda: enc.encode_tokens(tok), dev), mean_tokens=round(mean_len, 1))
        report(label, "encode_texts padded to context (reference)", n_texts, "captions",
               timed(lambda: enc.encode_tokens(tok, trim=False), dev))


def bench_verifier(label: str, ver: Verifier, n_images: int, per_image: int, ref_images: int) -> None:
    print(f"\n[{label}] {ver.model_id} on {ver.device} {ver.precision}", flush=True)
    dev = ver.device
    size = ver.image_processor.size["height"]
    pixels = torch.randn(n_images, 3, size, size)
    texts = captions(n_images * per_image)
    per = [texts[i * per_image : (i + 1) * per_image] for i in range(n_images)]
    report(label, "encode_images (ViT + cross-attn K/V)", n_images, "images", timed(lambda: ver.encode_images(pixels), dev))
    memo = ver.encode_images(pixels)
    report(label, f"score {per_image} captions/image from memo", n_images * per_image, "captions",
           timed(lambda: ver.score(memo, per), dev))
    report(label, f"encode+score, {per_image} captions/image", n_images, "images",
           timed(lambda: ver.score(ver.encode_images(pixels), per), dev))
    m = min(ref_images, n_images)
    flat_pix = pixels[:m].repeat_interleave(per_image, dim=0)
    flat_txt = [t for p in per[:m] for t in p]
    try:
        report(label, "score_pairs reference (image per pair)", m * per_image, "captions",
               timed(lambda: ver.score_pairs(flat_pix, flat_txt, batch_size=32), dev, 1))
    except Exception as e:  # the reference is optional here
        print(f"  score_pairs reference failed: {type(e).__name__}: {e}")


def bench_index(label: str, n: int, dim: int, queries: int, k: int, device: str) -> None:
    print(f"\n[{label}] exact top-{k} over {n} x {dim}", flush=True)
    g = torch.Generator().manual_seed(0)
    vecs = torch.nn.functional.normalize(torch.randn(n, dim, generator=g), dim=-1)
    index = CaptionIndex.from_arrays(vecs.numpy(), device=device, precision="fp16")
    q = torch.nn.functional.normalize(torch.randn(queries, dim, generator=g), dim=-1)
    report(label, f"search ({index.vectors.dtype}, {index.device})", queries, "queries",
           timed(lambda: index.search(q, k), index.device))


def tiny(args) -> None:
    dev = "cpu"
    with tempfile.TemporaryDirectory() as tmp:
        clip_path = build_tiny_clip(Path(tmp) / "clip" / "open_clip_model.safetensors")
        enc = load_dual_encoder(TINY_CLIP, str(clip_path), device=dev)
        bench_dual_encoder("tiny clip, cpu", enc, n_images=256, n_texts=4096)
        blip_dir = build_tiny_blip(Path(tmp) / "blip", captions(500))
        ver = load_verifier(str(blip_dir), device=dev)
        bench_verifier("tiny blip, cpu", ver, n_images=64, per_image=9, ref_images=16)
        bench_verifier("tiny blip, cpu", ver, n_images=64, per_image=20, ref_images=8)
    bench_index("index, cpu", n=100_000, dim=256, queries=256, k=9, device=dev)


def real_verifier(dev: torch.device) -> Verifier:
    """BLIP ITM large (blip-itm-large-coco shapes), random weights, a tokenizer trained on captions."""
    from transformers import BlipConfig, BlipForImageTextRetrieval, BlipImageProcessor
    from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

    cfg = BlipConfig(
        text_config=dict(vocab_size=30524, hidden_size=768, num_attention_heads=12, num_hidden_layers=12,
                         intermediate_size=3072, encoder_hidden_size=1024),
        vision_config=dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                           image_size=384, patch_size=16),
        image_text_hidden_size=256,
    )
    dtype = pick_dtype("auto", dev)
    with torch.device(dev):
        net = BlipForImageTextRetrieval(cfg)
    net = net.to(dtype).eval()
    tok = train_wordpiece_tokenizer(captions(2000), vocab_size=30000)
    proc = BlipImageProcessor(size={"height": 384, "width": 384}, image_mean=OPENAI_CLIP_MEAN, image_std=OPENAI_CLIP_STD)
    ver = Verifier(net, tok, proc, model_id="blip-itm-large/random", device=dev, dtype=dtype,
                   image_batch_size=32, pair_batch_size=512)
    return ver


def real(args) -> None:
    dev = torch.device("cuda")
    for name, n_img, n_txt in (("ViT-B-32", 512, 16384), ("ViT-bigG-14", 128, 16384)):
        enc = load_dual_encoder(name, None, device="cuda", image_batch_size=64, text_batch_size=1024)
        bench_dual_encoder(f"{name} random, cuda", enc, n_images=n_img, n_texts=n_txt)
        del enc
        torch.cuda.empty_cache()
    ver = real_verifier(dev)
    bench_verifier("BLIP ITM large random, cuda", ver, n_images=128, per_image=9, ref_images=32)
    bench_verifier("BLIP ITM large random, cuda", ver, n_images=128, per_image=20, ref_images=16)
    del ver
    torch.cuda.empty_cache()
    bench_index("index, cuda (COCO corpus size, bigG dim)", n=566_747, dim=1280, queries=1024, k=9, device="cuda")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--real-only", action="store_true", help="skip the tiny CPU benchmarks")
    ap.add_argument("--tiny-only", action="store_true", help="skip the real-size CUDA benchmarks")
    ap.add_argument("--json", type=Path, help="also write the figures as JSON")
    args = ap.parse_args()
    print(f"torch {torch.__version__}, cuda={torch.cuda.is_available()}"
          + (f" ({torch.cuda.get_device_name()})" if torch.cuda.is_available() else ""), flush=True)
    if not args.real_only:
        tiny(args)
    if not args.tiny_only:
        if torch.cuda.is_available():
            real(args)
        else:
            print("\n(no CUDA device: real-size benchmarks skipped)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(RESULTS, indent=2) + "\n")


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    main()

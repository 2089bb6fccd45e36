"""Time IFCap decoding: the reference beam search (official procedure, one image at a time, no KV
cache) vs the fast batched KV-cached beam search, and greedy.

    python benchmarks/decoding.py                 # tiny model on CPU (+ real size on CUDA if present)
    python benchmarks/decoding.py --real --device cuda --images 64 --width 20
    python benchmarks/decoding.py --json out.json
    python benchmarks/decoding.py --audit --json audit.json   # host reads + KV bytes per beam step

``--audit`` runs the fast beam search under :class:`adjcap.dispatch_audit.DispatchAudit` at the
demo's shape (the demo world's tiny IFCap when ``ADJCAP_TEST_WORLD`` or ``--world`` points at one,
else a freshly built tiny model; beam 20, max_len 20, batch 8) and at the real shape (GPT-2 small +
the released mapping-network sizes, random weights, ``--audit-real-steps`` steps) and reports
``host_reads_per_step``, ``kv_bytes_moved_per_step``, ``kv_cache_bytes`` and the CPU wall time per
image of the same decode without the audit.

Models: the tiny IFCap (built in a temp dir, as in the tests) and a real-size IFCap (GPT-2 small
config + the released mapping-network sizes) with random weights re-initialised by
``captioner_like_init`` so that captions stop after a realistic number of tokens. Both searches run
on the same prompts; the script also reports how many images got identical beams from both.
Prints images/s and captions/s (captions = images x beam width).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
import zlib
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adjcap.dispatch_audit import audit_decode  # noqa: E402
from adjcap.decoding import beam_search_fast, beam_search_reference, greedy_fast, greedy_reference  # noqa: E402
from adjcap.demo.tiny_ifcap import build_tiny_ifcap, captioner_like_init, train_gpt2_tokenizer  # noqa: E402
from adjcap.models.ifcap import ClipCaptionModel, IFCapCaptioner, MappingDims, gpt2_config, load_ifcap  # noqa: E402

WORDS = "man woman dog cat surfboard wave beach table pizza plate bus street car tree bench park kite".split()
CORPUS = [
    f"A {a} {p} a {b} in the {c}."
    for a in WORDS[:8]
    for p in ("on", "near", "with")
    for b in WORDS[4:12]
    for c in ("park", "street")
]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def tiny_captioner(tmp: Path) -> IFCapCaptioner:
    tok = train_gpt2_tokenizer(CORPUS, tmp / "tok", vocab_size=400)
    pt = build_tiny_ifcap(tmp / "ifcap", tok, clip_dim=24)
    return load_ifcap(pt, lm_config=pt.parent, tokenizer=tok, device="cpu", mapping_heads=2)


class _Tok:
    """Stand-in for the GPT-2 tokenizer in the real-size timing (texts are not needed)."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if text == ".":
            return [13]
        if text == " .":
            return [764]
        # ~1 token per word, like GPT-2 on the hard prompt
        return [(zlib.crc32(w.encode()) % 50000) + 100 for w in text.split()]  # not hash(): the same in every process

    def decode(self, ids) -> str:
        return " ".join(map(str, ids))


def real_captioner(device: torch.device, dtype: torch.dtype) -> IFCapCaptioner:
    torch.manual_seed(0)
    with torch.device(device):
        model = ClipCaptionModel(gpt2_config("gpt2"), MappingDims(), mapping_heads=8)
    captioner_like_init(model, 13, stop_bias=10.0)  # ~10: "." competes with 50k random logits
    model = model.to(dtype).eval()
    return IFCapCaptioner(model, _Tok(50257), device=device)


def make_prompts(cap: IFCapCaptioner, n: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    rnd = random.Random(seed)
    c = cap.dims.clip_dim
    x = torch.randn(n, c, generator=g)
    r = torch.randn(n, 5, c, generator=g)
    ents = [rnd.sample(WORDS, rnd.randint(0, 4)) for _ in range(n)]
    return cap.prompt_embeddings(cap.soft_prompt(x, r), ents)


def bench(name: str, cap: IFCapCaptioner, n_images: int, width: int, max_len: int, batch: int,
          ref_images: int, device: torch.device) -> dict:
    prompts = make_prompts(cap, n_images)
    gpt = cap.gpt
    stop = cap.stop_ids
    beam_search_fast(gpt, prompts[:2], beam_width=width, max_len=4, stop_ids=stop)  # warm-up
    _sync(device)
    t = time.perf_counter()
    fast = beam_search_fast(gpt, prompts, beam_width=width, max_len=max_len, stop_ids=stop, batch_size=batch)
    _sync(device)
    t_fast = time.perf_counter() - t
    n_ref = min(ref_images, n_images)
    t = time.perf_counter()
    ref = [beam_search_reference(gpt, p, beam_width=width, max_len=max_len, stop_ids=stop) for p in prompts[:n_ref]]
    _sync(device)
    t_ref = time.perf_counter() - t
    same = sum([b.tokens for b in a] == [b.tokens for b in f] for a, f in zip(ref, fast))
    t = time.perf_counter()
    greedy_fast(gpt, prompts, max_len=max_len, stop_ids=stop, batch_size=batch)
    _sync(device)
    t_gf = time.perf_counter() - t
    t = time.perf_counter()
    for p in prompts[:n_ref]:
        greedy_reference(gpt, p, max_len=max_len, stop_ids=stop)
    _sync(device)
    t_gr = time.perf_counter() - t
    lens = [b.length for bs in fast for b in bs]
    row = {
        "model": name,
        "device": str(device),
        "dtype": str(cap.dtype).replace("torch.", ""),
        "images": n_images,
        "width": width,
        "max_len": max_len,
        "batch": batch,
        "mean_tokens": sum(lens) / len(lens),
        "fast_images_per_s": n_images / t_fast,
        "fast_captions_per_s": n_images * width / t_fast,
        "ref_images": n_ref,
        "ref_images_per_s": n_ref / t_ref,
        "ref_captions_per_s": n_ref * width / t_ref,
        "speedup": (n_images / t_fast) / (n_ref / t_ref),
        "identical_beams": f"{same}/{n_ref}",
        "greedy_fast_images_per_s": n_images / t_gf,
        "greedy_ref_images_per_s": n_ref / t_gr,
    }
    return row


def demo_captioner(world: Path | None, tmp: Path) -> IFCapCaptioner:
    """The demo world's tiny IFCap when there is one, else the benchmark's own tiny model."""
    if world is not None and (world / "tiny" / "ifcap" / "tiny-ifcap.pt").is_file():
        t = world / "tiny"
        return load_ifcap(t / "ifcap" / "tiny-ifcap.pt", lm_config=t / "ifcap", tokenizer=t / "gpt2-tokenizer",
                          device="cpu", mapping_heads=2)
    return tiny_captioner(tmp)


def audit_row(name: str, cap: IFCapCaptioner, n_images: int, width: int, max_len: int, batch: int,
              timed_repeats: int = 1) -> dict:
    """The audit of one fast beam decode + its wall time per image without the audit (best of
    ``timed_repeats``)."""
    prompts = make_prompts(cap, n_images)
    gpt, stop = cap.gpt, cap.stop_ids

    def run():
        return beam_search_fast(gpt, prompts, beam_width=width, max_len=max_len, stop_ids=stop, batch_size=batch)

    run()  # warm-up
    best = float("inf")
    for _ in range(timed_repeats):
        t = time.perf_counter()
        beams = run()
        best = min(best, time.perf_counter() - t)
    row = {"model": name, "images": n_images, "width": width, "max_len": max_len, "batch": batch,
           "threads": torch.get_num_threads(), "wall_s_per_image": best / n_images}
    row.update(audit_decode(gpt, run))
    row["mean_tokens"] = sum(b.length for bs in beams for b in bs) / max(1, sum(len(bs) for bs in beams))
    row["beams_sha"] = _beams_digest(beams)
    return row


def _beams_digest(beams) -> str:
    import hashlib

    h = hashlib.sha256()
    for bs in beams:
        h.update(repr([(b.tokens, b.finished) for b in bs]).encode())
    return h.hexdigest()[:16]


def audit_main(args) -> list[dict]:
    import os

    rows = []
    world = args.world or (Path(os.environ["ADJCAP_TEST_WORLD"]) if os.environ.get("ADJCAP_TEST_WORLD") else None)
    with tempfile.TemporaryDirectory() as tmp:
        cap = demo_captioner(world, Path(tmp))
        rows.append(audit_row("demo (tiny IFCap)", cap, args.audit_images, 20, 20, 8, timed_repeats=3))
        print(json.dumps(rows[-1]), flush=True)
    if not args.no_real:
        cap = real_captioner(torch.device("cpu"), torch.float32)
        rows.append(audit_row("real-size (random weights)", cap, args.audit_real_images, 20,
                              args.audit_real_steps, args.audit_real_images))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=32)
    ap.add_argument("--width", type=int, default=20)
    ap.add_argument("--max-len", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32, help="images per fast-search batch")
    ap.add_argument("--ref-images", type=int, default=8, help="images timed with the (slow) reference")
    ap.add_argument("--real", action="store_true", help="also time the real-size model (default: when CUDA is there)")
    ap.add_argument("--no-tiny", action="store_true")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "bf16"])
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--audit", action="store_true", help="count host reads and KV bytes per beam step (CPU)")
    ap.add_argument("--world", type=Path, default=None, help="demo world for --audit (default: $ADJCAP_TEST_WORLD)")
    ap.add_argument("--audit-images", type=int, default=16)
    ap.add_argument("--audit-real-images", type=int, default=4)
    ap.add_argument("--audit-real-steps", type=int, default=24)
    ap.add_argument("--no-real", action="store_true", help="--audit: skip the real shape")
    ap.add_argument("--threads", type=int, default=2, help="--audit: torch threads for the timed runs")
    args = ap.parse_args()
    if args.audit:
        torch.set_num_threads(args.threads)
        rows = audit_main(args)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=2))
        return
    rows = []
    if not args.no_tiny:
        torch.set_num_threads(min(2, torch.get_num_threads()))
        with tempfile.TemporaryDirectory() as tmp:
            cap = tiny_captioner(Path(tmp))
            rows.append(bench("tiny", cap, args.images, args.width, min(args.max_len, 64), args.batch,
                              args.ref_images, torch.device("cpu")))
            print(json.dumps(rows[-1]), flush=True)
    if args.real or torch.cuda.is_available():
        device = torch.device(args.device)
        dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[args.precision]
        cap = real_captioner(device, dtype)
        rows.append(bench("real-size (random weights)", cap, args.images, args.width, args.max_len, args.batch,
                          args.ref_images, device))
        print(json.dumps(rows[-1]), flush=True)
    keys = ["model", "device", "dtype", "images", "width", "mean_tokens", "fast_images_per_s", "fast_captions_per_s",
            "ref_images_per_s", "ref_captions_per_s", "speedup", "identical_beams", "greedy_fast_images_per_s",
            "greedy_ref_images_per_s"]
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(f"{r[k]:.2f}" if isinstance(r[k], float) else str(r[k]) for k in keys) + " |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()

"""Time IFCap decoding: the reference beam search (official procedure, one image at a time, no KV
cache) vs the fast batched KV-cached beam search, and greedy.

    python benchmarks/decoding.py                 # tiny model on CPU (+ real size on CUDA if present)
    python benchmarks/decoding.py --real --device cuda --images 64 --width 20
    python benchmarks/decoding.py --json out.json
    python benchmarks/decoding.py --audit --json audit.json   # host reads + KV bytes per beam step
    python benchmarks/decoding.py --rows --json rows.json     # continuous batching at the real shape (CPU)
    python benchmarks/decoding.py --compile-cache --json cc.json  # compile time, first vs second process

``--rows`` decodes ``--rows-images`` images of varying prompt and caption length through
``--rows-slots`` image slots (beam 20, the real-size GPT-2 with random weights) and reports
``live_row_fraction`` (row-steps whose image was still being searched), the host reads per step (the
dispatch audit), and whether every image's beams equal those it gets decoded alone, and, with
``--against REV``, those of the fast search at git revision REV (log-prob differences too).

``--compile-cache`` compiles the beam step (inductor; on a CPU through the C compiler) in a fresh
process twice with the same ``captioner.compile_cache`` directory and reports the two compile times.

``--audit`` runs the fast beam search under :class:`adjcap.models.dispatch_audit.DispatchAudit` at the
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
from collections.abc import Sequence
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adjcap.models.dispatch_audit import audit_decode  # noqa: E402
from adjcap.models.decoding import beam_search_fast, beam_search_reference, greedy_fast, greedy_reference  # noqa: E402
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


def real_captioner(device: torch.device, dtype: torch.dtype, stop_bias: float = 10.0) -> IFCapCaptioner:
    torch.manual_seed(0)
    with torch.device(device):
        model = ClipCaptionModel(gpt2_config("gpt2"), MappingDims(), mapping_heads=8)
    captioner_like_init(model, 13, stop_bias=stop_bias)  # ~10: "." competes with 50k random logits
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


def _digest_rows(beams) -> list:
    return [[(b.tokens, b.finished) for b in bs] for bs in beams]


def _max_logprob_diff(a, b) -> float:
    return max((abs(x.score_sum - y.score_sum) for p, q in zip(a, b) for x, y in zip(p, q)), default=0.0)


def _old_fast(rev: str):
    """The fast beam search of git revision ``rev`` (a module loaded from ``git show``)."""
    import importlib.util
    import subprocess

    root = Path(__file__).resolve().parents[1]
    src = subprocess.run(["git", "show", f"{rev}:adjcap/models/decoding.py"], cwd=root, check=True, capture_output=True,
                         text=True).stdout
    path = Path(tempfile.mkdtemp()) / f"decoding_{rev}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(f"decoding_{rev}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod.beam_search_fast


def rows_main(args) -> dict:
    """Continuous batching at the real shape: live rows, host reads per step, beams per image."""
    torch.manual_seed(0)
    cap = real_captioner(torch.device("cpu"), torch.float32, stop_bias=args.stop_bias)
    prompts = make_prompts(cap, args.rows_images, seed=1)
    gpt, stop, w = cap.gpt, cap.stop_ids, 20

    def run(ps, slots, stats=None):
        return beam_search_fast(gpt, ps, beam_width=w, max_len=args.max_len, stop_ids=stop, batch_size=slots,
                                stats=stats)

    stats: dict = {}
    t = time.perf_counter()
    beams = run(prompts, args.rows_slots, stats)
    wall = time.perf_counter() - t
    steps_per_image = [max(b.length for b in bs) for bs in beams]
    row = {"model": "real-size GPT-2 (random weights)", "device": "cpu", "threads": torch.get_num_threads(),
           "stop_bias": args.stop_bias, "images": len(prompts), "width": w, "max_len": args.max_len, "slots": args.rows_slots,
           "rows": stats["rows"], "steps": stats["steps"], "live_row_fraction": round(stats["live_row_fraction"], 4),
           "steps_per_image_min_mean_max": [min(steps_per_image), round(sum(steps_per_image) / len(beams), 1),
                                            max(steps_per_image)],
           "prompt_lengths_min_max": [min(p.shape[0] for p in prompts), max(p.shape[0] for p in prompts)],
           "wall_s": round(wall, 1), "images_per_s": round(len(prompts) / wall, 3)}
    # the same images, each alone and in other company: the same beams
    k = min(args.rows_check, len(prompts))
    alone = [run([p], 1)[0] for p in prompts[:k]]
    row["beams_equal_alone"] = _digest_rows(alone) == _digest_rows(beams[:k])
    row["max_logprob_diff_alone"] = _max_logprob_diff(alone, beams[:k])
    shuffled = list(reversed(prompts[: 2 * k]))
    other = list(reversed(run(shuffled, max(1, args.rows_slots // 2))))[:k]
    row["beams_equal_other_company"] = _digest_rows(other) == _digest_rows(beams[:k])
    if args.against:
        old = _old_fast(args.against)(gpt, prompts[:k], beam_width=w, max_len=args.max_len, stop_ids=stop,
                                      batch_size=k)
        row["against_rev"] = args.against
        row["beams_equal_rev"] = _digest_rows(old) == _digest_rows(beams[:k])
        row["max_logprob_diff_rev"] = _max_logprob_diff(old, beams[:k])
    audit = audit_decode(gpt, lambda: run(prompts[: args.rows_slots * 2], args.rows_slots))
    row["host_reads_per_step"] = audit["host_reads_per_step"]
    row["host_reads_by_site"] = audit["host_reads_by_site"]
    row["host_reads_in_step_fn"] = sum(n for site, n in audit["host_reads_by_site"].items()
                                       if site.split(":")[0] in ("_gpt_step", "_attend", "_refill"))
    row["command"] = "python " + " ".join(sys.argv)
    print(json.dumps(row), flush=True)
    return row


def rows_probe(cap: IFCapCaptioner, device: torch.device, slots: Sequence[int], n_images: int,
               max_len: int = 64) -> dict:
    """images/s and the live share of the row-steps of ``n_images`` through each image-slot count (rows =
    slots x 20 beams, ``captioner.rows``), warm-up apart (benchmarks/gpu_probe.py's ``decode_rows``)."""
    prompts = [p.to(device) for p in make_prompts(cap, n_images, seed=1)]
    out = {}
    for n_slots in slots:
        stats: dict = {}

        def run():
            return beam_search_fast(cap.gpt, prompts, beam_width=20, max_len=max_len, stop_ids=cap.stop_ids,
                                    rows=n_slots * 20, stats=stats)

        run()  # warm-up
        _sync(device)
        t = time.perf_counter()
        run()
        _sync(device)
        s = time.perf_counter() - t
        out[f"slots{n_slots}"] = {"rows": stats["rows"], "images": len(prompts), "images_per_s": round(len(prompts) / s, 1),
                                  "s": round(s, 3), "steps": stats["steps"],
                                  "live_row_fraction": round(stats["live_row_fraction"], 4)}
        print(f"decode_rows slots{n_slots}: {out[f'slots{n_slots}']}", flush=True)
    return out


_COMPILE_CHILD = """
import json, os, sys, time, torch
sys.path.insert(0, {root!r})
from adjcap.models import decoding
from benchmarks.decoding import real_captioner, make_prompts, tiny_captioner
decoding.use_compile_cache({cache!r})
torch.manual_seed(0)
cap = {make}
ps = make_prompts(cap, 4)
step = torch.compile(decoding._gpt_step, fullgraph=True, backend="inductor")
t = time.perf_counter()
decoding.beam_search_fast(cap.gpt, ps, beam_width={w}, max_len=3, stop_ids=cap.stop_ids, batch_size=2, step=step)
print(json.dumps({{"first_call_s": time.perf_counter() - t}}))
"""


def compile_cache_main(args) -> dict:
    """The compiled step's first call in two fresh processes sharing one compile cache directory."""
    import subprocess

    root = str(Path(__file__).resolve().parents[1])
    make = ("real_captioner(torch.device('cpu'), torch.float32)" if args.compile_shape == "real" else
            "tiny_captioner(__import__('pathlib').Path(__import__('tempfile').mkdtemp()))")
    with tempfile.TemporaryDirectory() as tmp:
        code = _COMPILE_CHILD.format(root=root, cache=str(Path(tmp) / "compile"), make=make,
                                     w=20 if args.compile_shape == "real" else 5)
        env = {k: v for k, v in __import__("os").environ.items() if not k.startswith(("TORCHINDUCTOR_", "TRITON_"))}
        times = []
        for _ in range(2):
            out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
            if out.returncode:
                raise SystemExit(out.stderr[-3000:])
            times.append(json.loads(out.stdout.strip().splitlines()[-1])["first_call_s"])
    row = {"shape": args.compile_shape, "backend": "inductor", "device": "cpu", "first_process_s": round(times[0], 1),
           "second_process_s": round(times[1], 1), "ratio": round(times[1] / times[0], 3),
           "torch": torch.__version__, "command": "python " + " ".join(sys.argv)}
    print(json.dumps(row), flush=True)
    return row


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
    ap.add_argument("--rows", action="store_true", help="continuous batching at the real shape (CPU)")
    ap.add_argument("--rows-images", type=int, default=48)
    ap.add_argument("--rows-slots", type=int, default=8, help="--rows: image slots (rows = slots x 20)")
    ap.add_argument("--rows-check", type=int, default=4, help="--rows: images also decoded alone / elsewhere")
    ap.add_argument("--against", default=None, help="--rows: also compare with the fast search at this git revision")
    ap.add_argument("--stop-bias", type=float, default=12.0, help="--rows: the random model's pull toward '.' "
                    "(12: the longest of 20 beams stops after ~5-20 steps, as a captioner's)")
    ap.add_argument("--compile-cache", action="store_true", help="compile time: first vs second process")
    ap.add_argument("--compile-shape", default="tiny", choices=["tiny", "real"])
    args = ap.parse_args()
    if args.rows or args.compile_cache:
        torch.set_num_threads(args.threads)
        row = rows_main(args) if args.rows else compile_cache_main(args)
        if args.json:
            args.json.write_text(json.dumps(row, indent=2))
        return
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

"""One lent GPU's minutes, in one command: the real-size job's stages end to end and the few facts only a
GPU can give (precision, attention, decode batch and capture, index search), written as JSON.

    python benchmarks/gpu_probe.py --out DIR                       # on the GPU machine (defaults: 64 images)
    python benchmarks/gpu_probe.py --out DIR --device cpu --judges cpu-16gb --images 2 --corpus 64 \
        --sections assets e2e                                      # a smoke test of the script on a CPU

A GPU is lent for minutes, so every section is guarded: a failing section records its error and the next
one runs; a section that would start after ``--budget-s`` seconds is skipped; the JSON is rewritten after
every section, so a run killed at its limit still returns what it measured. Sections (``--sections``):

* ``env``: the card, its memory, the versions;
* ``assets``: benchmarks/realsize.py's random-weight checkpoints in the real layouts (bigG, BLIP ITM large,
  IFCap with GPT-2 124M) and the data;
* ``e2e``: the job's four stages in one process, one pool's models at a time (realsize.run_stages), per
  variant: ``fp32`` (the paper's presets), ``bf16-all`` (everything bf16, GPT-2 too: what realsize's bf16
  run measured), ``gpu`` (bf16 encoders and verifier, GPT-2 fp32 with TF32: the planned ``gpu`` preset);
  seconds per image per stage, the corpus encode rate and the peak GPU memory of each;
* ``decode``: the real-size IFCap beam (width 20, up to 64 tokens) at batch 16 and 64, fp32 and TF32;
* ``clip``: bigG's image tower on 64 images at fp32, TF32 and bf16; its text tower by sequence length;
* ``attention``: BLIP-L vision attention (577 tokens, 16 heads) as matmul + softmax vs
  ``scaled_dot_product_attention``;
* ``index``: top-k over a 566,747 x 1,280 fp16 index for a batch of 64 queries;
* ``capture``: the beam step under ``torch.compile`` (default and ``reduce-overhead``, i.e. CUDA graphs)
  against eager, with the compile time.

Random weights: the speeds are real, the captions are gibberish. Nothing is asserted; BENCHMARKS.md takes
the figures by hand, with the device and this command.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

SECTIONS = ("env", "assets", "e2e", "decode", "decode_rows", "clip", "attention", "index", "capture")
RESULTS: dict = {}
T0 = time.perf_counter()


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def best_of(fn, reps: int = 3, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    sync()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t)
    return best


def peak_reset() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_gib() -> float | None:
    return round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available() else None


def tf32(on: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on


def save(out: Path) -> None:
    RESULTS["elapsed_s"] = round(time.perf_counter() - T0, 1)
    tmp = out / "gpu_probe.json.tmp"
    tmp.write_text(json.dumps(RESULTS, indent=1, default=str))
    os.replace(tmp, out / "gpu_probe.json")


# ------------------------------------------------------------------------------------------------

def env(args, ctx) -> dict:
    import transformers

    d = {"torch": torch.__version__, "transformers": transformers.__version__, "cuda": torch.version.cuda,
         "device": args.device}
    try:
        import open_clip

        d["open_clip"] = open_clip.__version__
    except Exception as e:  # noqa: BLE001
        d["open_clip"] = f"missing: {e}"
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        d.update(name=p.name, memory_gib=round(p.total_memory / 2**30, 1), sms=p.multi_processor_count,
                 capability=f"{p.major}.{p.minor}")
    return d


def assets(args, ctx) -> dict:
    from benchmarks.realsize import write_assets

    t = time.perf_counter()
    ctx["assets"] = write_assets(args.root, args.images, args.corpus, args.judges)
    return {"write_s": round(time.perf_counter() - t, 1), "files": {k: str(v) for k, v in ctx["assets"].items()}}


VARIANTS = {
    # name: (precision of realsize's --set overrides, GPT-2's precision, TF32)
    "fp32": ("fp32", "fp32", False),
    "bf16-all": ("bf16", "bf16", False),
    "gpu": ("bf16", "fp32", True),
}


def e2e(args, ctx) -> dict:
    from adjcap.config import load_config
    from benchmarks.realsize import overrides, run_stages

    out = {}
    for name in args.variants:
        if time.perf_counter() - T0 > args.budget_s:
            out[name] = "skipped: over the time budget"
            continue
        prec, gpt, tf = VARIANTS[name]
        sets = [s for s in overrides(ctx["assets"], prec, args.device, args.images, args.root / "cache", args.judges)
                if not s.startswith("captioner.precision=")] + [f"captioner.precision={gpt}"]
        cfg = load_config("headline", sets).resolved()
        tf32(tf)
        peak_reset()
        t = time.perf_counter()
        try:
            r = run_stages(cfg, args.images)
        except Exception as e:  # noqa: BLE001
            r = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
        r["wall_s"] = round(time.perf_counter() - t, 1)
        r["peak_gib"] = peak_gib()
        if "stage_s_per_image" in r:
            per = sum(r["stage_s_per_image"].values())
            r["images_per_s_stages"] = round(1 / per, 2) if per else None
        out[name] = r
        print(f"e2e {name}: {json.dumps(r, default=str)[:600]}", flush=True)
        RESULTS["e2e"] = out
        save(args.out)
    tf32(False)
    return out


def decode(args, ctx) -> dict:
    from adjcap.decoding import beam_search_fast
    from benchmarks.decoding import make_prompts, real_captioner

    dev = torch.device(args.device)
    cap = real_captioner(dev, torch.float32)
    ctx["captioner"] = cap
    prompts = [p.to(dev) for p in make_prompts(cap, args.decode_images)]
    out = {}
    for tf in (False, True):
        tf32(tf)
        for batch in (16, 64):
            peak_reset()

            def run():
                return beam_search_fast(cap.gpt, prompts, beam_width=20, max_len=64, stop_ids=cap.stop_ids,
                                        batch_size=batch)

            s = best_of(run, reps=2)
            beams = run()
            toks = sum(b.length for bs in beams for b in bs) / max(1, sum(len(bs) for bs in beams))
            key = f"batch{batch}_{'tf32' if tf else 'fp32'}"
            out[key] = {"images_per_s": round(len(prompts) / s, 1), "s": round(s, 3), "peak_gib": peak_gib(),
                        "mean_tokens": round(toks, 1)}
            print(f"decode {key}: {out[key]}", flush=True)
    tf32(False)
    return out


def decode_rows(args, ctx) -> dict:
    """Continuous batching (``captioner.rows``): live rows and images/s at 64/128/256 image slots x 20 beams
    (the dry run: the demo's tiny IFCap, 2 slots)."""
    import tempfile

    from benchmarks.decoding import demo_captioner, real_captioner, rows_probe

    dry, dev = getattr(args, "dry_run", False), torch.device(args.device)
    cap = demo_captioner(args.root, Path(tempfile.mkdtemp())) if dry else real_captioner(dev, torch.float32, 12.0)
    return rows_probe(cap, dev, (2,) if dry else (64, 128, 256), 4 if dry else 1024)


def clip(args, ctx) -> dict:
    from adjcap.config import load_config
    from adjcap.models.roles import load_retrieval_encoder
    from benchmarks.realsize import overrides

    cfg = load_config("headline", overrides(ctx["assets"], "fp32", args.device, args.images,
                                            args.root / "cache", args.judges)).resolved()
    out = {}
    n = 64 if args.device != "cpu" else 2
    for prec in ("fp32", "bf16"):
        enc = load_retrieval_encoder(cfg.retrieval.encoder.model_copy(update={"precision": prec}), args.device,
                                     towers=("image", "text"))
        x = torch.randn(n, 3, *enc.image_size, device=args.device)
        for tf in ((False, True) if prec == "fp32" else (False,)):
            tf32(tf)
            peak_reset()
            s = best_of(lambda: enc.encode_images(x), reps=3)
            key = f"image_{prec}{'_tf32' if tf else ''}"
            out[key] = {"images_per_s": round(n / s, 1), "peak_gib": peak_gib()}
            print(f"clip {key}: {out[key]}", flush=True)
        tf32(False)
        texts = ["a man riding a wave on top of a surfboard"] * (320 if args.device != "cpu" else 8)
        for reps in (1, 4):  # ~10 and ~37 tokens: the padded length is what the tower pays for
            tt = [" ".join([t] * reps) for t in texts]
            s = best_of(lambda: enc.encode_texts(tt, normalize=True), reps=3)
            out[f"text_{prec}_len{reps}x"] = {"texts_per_s": round(len(tt) / s, 1)}
        print(f"clip text {prec}: {[(k, v) for k, v in out.items() if k.startswith('text_' + prec)]}", flush=True)
        enc = x = None  # freed before the next precision loads
        peak_reset()
    return out


def attention(args, ctx) -> dict:
    import torch.nn.functional as F

    out = {}
    b = 64 if args.device != "cpu" else 2
    for dt in (torch.float32, torch.bfloat16):
        q, k, v = (torch.randn(b, 16, 577, 64, device=args.device, dtype=dt) for _ in range(3))

        def eager():
            a = (q @ k.transpose(-1, -2)) * 64 ** -0.5
            return a.softmax(-1) @ v

        def sdpa():
            return F.scaled_dot_product_attention(q, k, v)

        diff = (eager().float() - sdpa().float()).abs().max().item()
        te, ts = best_of(eager, reps=5), best_of(sdpa, reps=5)
        out[str(dt).split(".")[-1]] = {"eager_ms": round(te * 1e3, 2), "sdpa_ms": round(ts * 1e3, 2),
                                        "speedup": round(te / ts, 2), "max_abs_diff": diff}
    return out


def index(args, ctx) -> dict:
    from adjcap.index.store import CaptionIndex
    import numpy as np

    n = 566_747 if args.device != "cpu" else 4096
    rng = np.random.default_rng(0)
    v = rng.standard_normal((n, 1280), dtype=np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    t = time.perf_counter()
    idx = CaptionIndex.from_arrays(v, device=args.device, precision="fp16")
    load_s = time.perf_counter() - t
    del v
    q = torch.nn.functional.normalize(torch.randn(64, 1280), dim=-1)
    s = best_of(lambda: idx.search(q, 20), reps=5)
    return {"captions": n, "load_s": round(load_s, 2), "search_ms_per_64": round(s * 1e3, 2),
            "peak_gib": peak_gib()}


def capture(args, ctx) -> dict:
    """The fast beam with its step eager and under torch.compile, passed as the loaded captioner passes it
    (``captioner.compile``: ``beam_search_fast(step=)``), nothing patched."""
    from adjcap import decoding
    from adjcap.decoding import beam_search_fast
    from benchmarks.decoding import make_prompts, real_captioner

    dev = torch.device(args.device)
    cap = ctx.get("captioner") or real_captioner(dev, torch.float32)
    prompts = [p.to(dev) for p in make_prompts(cap, args.decode_images)]
    out = {}

    def run(step=None):
        return beam_search_fast(cap.gpt, prompts, beam_width=20, max_len=64, stop_ids=cap.stop_ids, batch_size=64,
                                step=step)

    ref = [[(b.tokens, b.finished) for b in bs] for bs in run()]
    out["eager_s"] = round(best_of(run, reps=2), 3)
    for mode in ("default", "reduce-overhead"):
        if time.perf_counter() - T0 > args.budget_s:
            out[mode] = "skipped: over the time budget"
            continue
        torch._dynamo.reset()
        # "default" is what captioner.compile=default runs (decoding.compiled_step); the other mode is probed here only
        step = decoding.beam_step("default", dev) if mode == "default" else \
            torch.compile(decoding._gpt_step, fullgraph=True, dynamic=True, mode=mode)
        try:
            t = time.perf_counter()
            got = run(step)
            first = time.perf_counter() - t
            s = best_of(lambda: run(step), reps=2, warmup=0)
            same = [[(b.tokens, b.finished) for b in bs] for bs in got] == ref
            out[mode] = {"first_call_s": round(first, 1), "s": round(s, 3), "speedup": round(out["eager_s"] / s, 2),
                         "same_beams": same}
        except Exception as e:  # noqa: BLE001
            out[mode] = {"error": f"{type(e).__name__}: {e}"[:1500]}
        print(f"capture {mode}: {out[mode]}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--root", type=Path, default=Path("/tmp/adjcap-realsize"), help="where the checkpoints go")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--images", type=int, default=64)
    ap.add_argument("--corpus", type=int, default=50_000)
    ap.add_argument("--decode-images", type=int, default=64)
    ap.add_argument("--judges", default="headline", choices=["headline", "cpu-16gb"])
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=SECTIONS)
    ap.add_argument("--budget-s", type=float, default=420.0, help="start no section after this many seconds")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    ctx: dict = {}
    fns = {"env": env, "assets": assets, "e2e": e2e, "decode": decode, "decode_rows": decode_rows, "clip": clip, "attention": attention,
           "index": index, "capture": capture}
    for name in args.sections:
        if name not in ("env", "assets") and time.perf_counter() - T0 > args.budget_s:
            RESULTS[name] = "skipped: over the time budget"
            continue
        t = time.perf_counter()
        print(f"== {name} (at {t - T0:.0f}s)", flush=True)
        try:
            RESULTS[name] = fns[name](args, ctx)
        except Exception as e:  # noqa: BLE001
            RESULTS[name] = {"error": f"{type(e).__name__}: {e}"[:1500], "traceback": traceback.format_exc()[-3000:]}
            print(RESULTS[name]["traceback"], flush=True)
        RESULTS.setdefault("section_s", {})[name] = round(time.perf_counter() - t, 1)
        save(args.out)
        if name == "assets" and isinstance(RESULTS[name], dict) and "error" in RESULTS[name]:
            break  # nothing else can run without the checkpoints
    print(json.dumps(RESULTS, indent=1, default=str)[-6000:], flush=True)


if __name__ == "__main__":
    main()

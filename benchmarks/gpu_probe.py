"""One lent GPU's minutes, in one command: the `gpu` preset's stages and Ray job at real size, and the few
facts only a GPU can give, written as JSON after every section.

    python benchmarks/gpu_probe.py --out DIR                # on the GPU machine (at most ~8 min of GPU time)
    python benchmarks/gpu_probe.py --dry-run --out F.json   # every section on CPU at tiny shapes (make test-fast)

A GPU is lent for minutes, so every section is guarded: a failing section records its error and the next
one runs; a section that would start after ``--budget-s`` seconds is skipped (recorded so); the JSON is
rewritten after every section, so a run killed at its limit still returns what it measured. Sections run in
the order of the registry :data:`SECTIONS` (``@section`` adds one; ``--sections`` picks some):

* ``env``: the card, its memory, the versions, TF32, MPS, whether Ray imports;
* ``assets``: benchmarks/realsize.py's random-weight checkpoints in the real layouts (bigG, BLIP ITM large,
  IFCap with GPT-2 124M), ``--images`` *distinct* synthetic images (distinct content and sizes) and a corpus
  of ``--corpus`` captions; the dry run uses the demo world's tiny models instead;
* ``stages``: the job's four stages in one process per variant (``fp32``: the headline preset; ``gpu``: the
  gpu preset), the first batch (warm-up: CUDA context, kernels, autotuning) apart from the steady batches;
  per stage the wall seconds per image and the CUDA-event GPU span and the profiler's kernel (GPU-busy) time,
  the kernels launched per image and the last batch's six costliest kernels;
  with both variants, the gpu preset's parity against fp32 at real size (benchmarks/realsize.py's: images
  whose retrieval, kept captions, beam or each judge's top candidate differ);
* ``corpus``: the corpus encode: tokenising apart from the text tower, captions/s;
* ``ray_job``: ``run-job`` at ``--job-images`` x ``--job-corpus`` with the gpu preset in three layouts: one
  fused actor on the GPU, two fused actors sharing it, and the split pools (under MPS when its control daemon
  can be started), each with its own stage cache; per layout the job's overall rate (model loading and the
  first job's index build included) and its streaming rate (first batch back to last); skipped with its
  reason when Ray does not import; the dry run builds every layout's configuration and starts no Ray;
* ``decode``, ``clip``, ``attention``, ``index``, ``capture``: the beam at batch 16/64 fp32/TF32, bigG's
  towers by precision, BLIP-L attention eager vs SDPA, top-k over the 566,747-caption index, and the beam
  step under ``torch.compile`` (the dry run compiles with the ``eager`` backend: the graph, no codegen).

Random weights: the speeds are real, the captions are gibberish. Nothing is asserted; BENCHMARKS.md takes
the figures by hand, with the device and this command.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

# the section registry: name -> function(args, ctx) -> dict, run in this order
SECTIONS: dict[str, Callable[[argparse.Namespace, dict], dict]] = {}
RESULTS: dict = {}
REPS = [3]  # the most timed repetitions (Shapes.reps)
T0 = time.perf_counter()


def section(fn: Callable[[argparse.Namespace, dict], dict]) -> Callable[[argparse.Namespace, dict], dict]:
    """Register ``fn`` as a section named after it (one line: ``@section`` above a new section)."""
    SECTIONS[fn.__name__] = fn
    return fn


@dataclass(frozen=True)
class Shapes:
    """How big each section's work is: the GPU run's, or the dry run's tiny ones."""

    images: int = 256  # distinct synthetic images through the stages
    batch: int = 64  # images per stage call
    corpus: int = 100_000  # captions of the corpus section (the job's index has its own)
    job_images: int = 2_000
    job_corpus: int = 566_747
    decode_images: int = 64
    decode_batches: tuple[int, ...] = (16, 64)
    clip_images: int = 64
    clip_texts: int = 320
    attention_batch: int = 64
    index_captions: int = 566_747
    beam_width: int = 20
    max_len: int = 64
    reps: int = 3  # timed repetitions (best of)


DRY = Shapes(images=4, batch=2, corpus=64, job_images=4, job_corpus=64, decode_images=1, decode_batches=(1,),
             clip_images=2, clip_texts=8, attention_batch=1, index_captions=512, beam_width=3, max_len=4, reps=1)

# name: (preset, its root precision); the gpu preset first: its per-stage wall and GPU-busy times are what a
# short lease must bring back (the fp32 variant was measured on the H200 of 2026-11-28; with both, parity)
VARIANTS = {"gpu": ("gpu", "bf16"), "fp32": ("headline", "fp32")}


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def best_of(fn, reps: int = 3, warmup: int = 1) -> float:
    reps = min(reps, REPS[0])
    for _ in range(min(warmup, REPS[0])):
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


def over_budget(args) -> bool:
    return time.perf_counter() - T0 > args.budget_s


def save(out: Path) -> None:
    RESULTS["elapsed_s"] = round(time.perf_counter() - T0, 1)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(RESULTS, indent=1, default=str))
    os.replace(tmp, out)


def gpu_timed(fn, detail: bool = False) -> dict:
    """``fn()``'s wall seconds, and on CUDA its GPU span (CUDA events on the current stream) and GPU-busy
    time (the profiler's kernel time: the span less the gaps where the GPU waited on the host); with
    ``detail``, also the kernels launched (``launches``: each costs the host a launch) and the six that took
    the most GPU time (``top``), which say where a stage's time goes when one lease is all there is."""
    if not torch.cuda.is_available():
        t = time.perf_counter()
        fn()
        return {"wall_s": time.perf_counter() - t, "gpu_span_s": None, "gpu_busy_s": None,
                **({"launches": None, "top": None} if detail else {})}
    from torch.profiler import ProfilerActivity, profile

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        start.record()
        fn()
        end.record()
        sync()
        wall = time.perf_counter() - t
    events = [e for e in prof.key_averages() if e.self_device_time_total > 0]
    out = {"wall_s": wall, "gpu_span_s": start.elapsed_time(end) / 1e3,
           "gpu_busy_s": sum(e.self_device_time_total for e in events) / 1e6}
    if detail:
        out["launches"] = sum(e.count for e in events)
        out["top"] = [{"kernel": e.key[:100], "ms": round(e.self_device_time_total / 1e3, 2), "calls": e.count}
                      for e in sorted(events, key=lambda e: -e.self_device_time_total)[:6]]
    return out


# ------------------------------------------------------------------------------------------------
# inputs


def distinct_images(folder: Path, n: int, seed: int = 0) -> list[Path]:
    """``n`` JPEGs of distinct content and sizes (gradients, blocks and noise, 160-1024 px a side), named
    as COCO's, so that no two images decode, resize or embed alike (beams do not finish in lockstep)."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(n):
        p = folder / f"COCO_val2014_{900000000 + i:012d}.jpg"
        paths.append(p)
        if p.exists():
            continue
        w, h = (int(x) for x in rng.integers(160, 1025, size=2))
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        base = rng.uniform(0, 255, size=(3, 1, 1)) + rng.uniform(-1, 1, size=(3, 1, 1)) * (xx / w * 200 + yy / h * 55)
        img = np.clip(base, 0, 255).transpose(1, 2, 0)
        for _ in range(int(rng.integers(2, 9))):  # a few coloured blocks
            x0, y0 = int(rng.integers(0, w - 8)), int(rng.integers(0, h - 8))
            img[y0:y0 + int(rng.integers(8, h // 2 + 9)), x0:x0 + int(rng.integers(8, w // 2 + 9))] = rng.uniform(
                0, 255, size=3)
        img = np.clip(img + rng.normal(0, 12, size=img.shape), 0, 255).astype(np.uint8)
        Image.fromarray(img).save(p, quality=90)
    return paths


def write_benchmark(folder: Path, n_images: int, n_corpus: int) -> dict[str, Path]:
    """Distinct images with references (the fixture's, in turn) and a corpus, in IFCap's layout."""
    from benchmarks.realsize import FIXTURES, corpus_captions

    refs = list(json.loads((FIXTURES / "coco_test_captions.json").read_text()).values())
    images = distinct_images(folder / f"images-{n_images}", n_images)
    ann = folder / f"test_captions-{n_images}.json"
    ann.write_text(json.dumps({p.name: refs[i % len(refs)] for i, p in enumerate(images)}))
    corpus = folder / f"corpus-{n_corpus}.json"
    if not corpus.exists():
        corpus.write_text(json.dumps({f"c{i}.jpg": [c] for i, c in enumerate(corpus_captions(n_corpus))}))
    return {"images": images[0].parent, "annotations": ann, "corpus": corpus}


def job_config(args, ctx, variant: str, sets: tuple[str, ...] = (), data: dict | None = None):
    """The variant's configuration (resolved): the real-size files and ``data`` on a GPU run, the demo
    world's tiny models (jobs.demo.on_demo_world) in the dry run."""
    from adjcap.config import load_config

    preset, prec = VARIANTS[variant]
    if args.dry_run:
        from adjcap.jobs.demo import on_demo_world

        base = [f"paths.cache_dir={args.root}", f"paths.runs_dir={args.root / 'runs'}", "device=cpu",
                f"limit={args.shape.images}"]
        from adjcap.config import apply_override, validate_config

        data = on_demo_world(load_config(preset, base)).model_dump(mode="json")
        for assignment in sets:  # after the demo world's keys (it sets the ray section's own)
            apply_override(data, assignment)
        return validate_config(data).resolved()
    from benchmarks.realsize import overrides

    files = {**ctx["assets"], **(data or ctx["data"])}
    n = int(json.loads(Path(files["annotations"]).read_text()).__len__())
    return load_config(preset, [*overrides(files, prec, args.device, n, args.root / "cache", args.judges),
                                *sets]).resolved()


def image_states(cfg, paths: list[Path]) -> list:
    """Decoded states of ``paths`` with their pixels prepared as the Ray job's decode tasks do."""
    from adjcap.engine import image_state, stage_registry

    preps, known = stage_registry.pixel_preps(cfg, stage_registry.names())
    states = []
    for p in paths:
        s = image_state.decode_state(p.stem, cfg.benchmark, "test", None, str(p), keep_bytes=not known)
        s.prepare_pixels(preps)
        states.append(s)
    return states


# ------------------------------------------------------------------------------------------------
# sections


@section
def env(args, ctx) -> dict:
    import transformers

    d = {"torch": torch.__version__, "transformers": transformers.__version__, "cuda": torch.version.cuda,
         "hip": getattr(torch.version, "hip", None), "device": args.device, "dry_run": args.dry_run,
         "gpu": torch.cuda.is_available(), "shapes": asdict(args.shape)}
    if not torch.cuda.is_available():
        d["no_gpu"] = "no CUDA device in this process: GPU spans, busy times and peak memory are null"
    try:
        import open_clip

        d["open_clip"] = open_clip.__version__
    except Exception as e:  # noqa: BLE001
        d["open_clip"] = f"missing: {e}"
    try:
        import ray

        d["ray"] = ray.__version__
    except Exception as e:  # noqa: BLE001
        d["ray"] = None
        d["ray_missing"] = f"{type(e).__name__}: {e}"
    d["mps_control"] = shutil.which("nvidia-cuda-mps-control")
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        d.update(name=p.name, memory_gib=round(p.total_memory / 2**30, 1), sms=p.multi_processor_count,
                 capability=f"{p.major}.{p.minor}")
    return d


@section
def assets(args, ctx) -> dict:
    t = time.perf_counter()
    if args.dry_run:
        from adjcap.jobs.demo import prepare
        from adjcap.config import load_config

        prepare(load_config("demo", [f"paths.cache_dir={args.root}"]))  # the demo world (kept when built)
        ctx["assets"] = {}
    else:
        from benchmarks.realsize import write_assets

        ctx["assets"] = write_assets(args.root, 2, 64, args.judges)  # the models (and a tiny default data set)
    ctx["data"] = write_benchmark(args.root / "probe-data", args.shape.images, args.shape.corpus)
    ctx["images"] = sorted(Path(ctx["data"]["images"]).glob("*.jpg"))
    sizes = set()
    from PIL import Image

    for p in ctx["images"]:
        with Image.open(p) as im:
            sizes.add(im.size)
    return {"write_s": round(time.perf_counter() - t, 1), "images": len(ctx["images"]),
            "distinct_sizes": len(sizes), "files": {k: str(v) for k, v in {**ctx["assets"], **ctx["data"]}.items()}}


@section
def stages(args, ctx) -> dict:
    from adjcap.engine import stage_registry
    from adjcap.models.precision import set_tf32
    from adjcap.engine.pipeline import load_models
    from benchmarks.realsize import outputs, parity

    out = {}
    b = args.shape.batch
    for name in args.variants:
        if over_budget(args):
            out[name] = "skipped: over the time budget"
            continue
        cfg = job_config(args, ctx, name)
        set_tf32(cfg.tf32, cfg.device)
        peak_reset()
        t = time.perf_counter()
        models = vars(load_models(cfg))
        r: dict = {"load_s": round(time.perf_counter() - t, 1), "tf32": bool(torch.backends.cuda.matmul.allow_tf32),
                   "warmup": {}, "steady": {}}
        states = image_states(cfg, ctx["images"])
        batches = [states[i:i + b] for i in range(0, len(states), b)]
        for stage in stage_registry.stages():
            first = gpu_timed(lambda: stage.run(batches[0], models, cfg))
            r["warmup"][stage.name] = {k: (round(v, 4) if v is not None else None) for k, v in first.items()}
            rest = [gpu_timed(lambda bb=bb: stage.run(bb, models, cfg), detail=True) for bb in batches[1:]]
            n = sum(len(bb) for bb in batches[1:])
            r["steady"][stage.name] = {
                f"{k}_per_image": (round(sum(x[k] for x in rest) / n, 5) if n and rest[0][k] is not None else None)
                for k in ("wall_s", "gpu_span_s", "gpu_busy_s", "launches")}
            r["steady"][stage.name]["top_kernels_last_batch"] = rest[-1]["top"] if rest else None
        per = sum(v["wall_s_per_image"] or 0 for v in r["steady"].values())
        r["images_per_s_steady"] = round(1 / per, 2) if per else None
        r["errors"] = sorted({s.error for s in states if s.error})[:5]
        r["candidates_per_image"] = round(sum(len(s.candidates or []) for s in states) / len(states), 1)
        r["peak_gib"] = peak_gib()
        ctx.setdefault("outputs", {})[name] = outputs(states)
        out[name] = r
        print(f"stages {name}: {json.dumps(r, default=str)[:600]}", flush=True)
        RESULTS["stages"] = out
        save(args.out)
        models = states = batches = None
    if {"fp32", "gpu"} <= set(ctx.get("outputs", {})):  # the gpu preset's parity at real size (random weights)
        out["parity_gpu_vs_fp32"] = parity(ctx["outputs"]["fp32"], ctx["outputs"]["gpu"])
    tf32(False)
    return out


@section
def corpus(args, ctx) -> dict:
    from adjcap.data.corpus import load_corpus
    from adjcap.models.roles import load_retrieval_encoder

    cfg = job_config(args, ctx, "gpu")
    texts = list(load_corpus(ctx["data"]["corpus"], "ifcap").texts) if not args.dry_run else \
        list(load_corpus(cfg.benchmark_cfg().corpus, cfg.benchmark_cfg().corpus_format).texts)[:args.shape.corpus]
    enc = load_retrieval_encoder(cfg.retrieval.encoder, cfg.device, towers=("text",))
    t = time.perf_counter()
    tokens = enc.tokenize(texts)
    tok_s = time.perf_counter() - t
    enc.encode_texts(texts[:512])  # warm-up: kernels, autotuning
    timing = gpu_timed(lambda: enc.encode_tokens(tokens))
    return {"captions": len(texts), "tokenize_captions_per_s": round(len(texts) / tok_s),
            "tokenizer": type(enc.tokenizer).__name__, "tokenizer_fallbacks": getattr(enc.tokenizer, "fallbacks", None),
            "encode_captions_per_s": round(len(texts) / timing["wall_s"]), **timing, "peak_gib": peak_gib()}


def _mps_on() -> tuple[bool, str]:
    """Start the MPS control daemon when this machine has one (the split layout's GPU sharing)."""
    exe = shutil.which("nvidia-cuda-mps-control")
    if not exe or not torch.cuda.is_available():
        return False, "no nvidia-cuda-mps-control or no CUDA: the split pools time-slice the GPU"
    r = subprocess.run([exe, "-d"], capture_output=True, text=True)
    return r.returncode == 0, (r.stderr or r.stdout).strip() or "started"


@section
def ray_job(args, ctx) -> dict:
    # fused first: what ray.pools=auto runs on a GPU without MPS; then two fused actors sharing the GPU (one's
    # host work beside the other's kernels, time-sliced); then the split pools under MPS
    layouts = {"fused": ("ray.pools=fused",),
               "fused-x2": ("ray.pools=fused", "ray.pool.fused.actors=2", "ray.pool.fused.gpus=0.5"),
               "split-mps": ("ray.pools=split", "ray.mps=true")}
    data = ctx.get("job_data") or write_benchmark(args.root / "probe-job", args.shape.job_images, args.shape.job_corpus)
    ctx["job_data"] = data
    from adjcap.engine import pools

    cfgs = {k: job_config(args, ctx, "gpu", sets, data) for k, sets in layouts.items()}
    out: dict = {"images": args.shape.job_images, "corpus": args.shape.job_corpus,
                 "layouts": {k: {"pools": c.ray.pools, "precision": c.precision, "tf32": c.tf32,
                                 **({"fused_actors": pools.actors(c, pools.FUSED),
                                     "fused_gpus": pools.gpu_share(c, pools.FUSED)} if c.ray.pools == pools.FUSED else {})}
                             for k, c in cfgs.items()}}
    if args.dry_run:
        out["skipped"] = "dry run: both layouts' configurations built; no Ray started (the test budget)"
        return out
    try:
        import ray  # noqa: F401
    except ImportError as e:
        out["skipped"] = f"Ray does not import on this machine ({e}); the job was not run"
        return out
    from benchmarks.realsize import overrides, run_ray

    env_vars = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    for name, sets in layouts.items():
        if over_budget(args):
            out[name] = "skipped: over the time budget"
            continue
        mps = _mps_on() if name.startswith("split") else (False, "fused: one process per GPU")
        files = {**ctx["assets"], **data}
        # each layout its own stage cache (the corpus index stays shared): a layout run after another must
        # compute its stages, not read the other's (the H200 run of 2026-11-28 measured the cache instead)
        job_sets = [*overrides(files, "bf16", args.device, args.shape.job_images, args.root / "cache", args.judges),
                    f"cache.stages_dir={args.root / 'stages' / name}", *sets]
        try:
            left = args.budget_s + 150 - (time.perf_counter() - T0)  # a job may run past the budget a little
            r = run_ray(job_sets, args.root / "runs" / f"probe-{name}", env_vars, preset="gpu", evaluate=False,
                        timeout_s=max(60.0, left))
        except (Exception, SystemExit) as e:  # noqa: BLE001
            r = {"error": f"{type(e).__name__}: {e}"[:1500]}
        r["mps"] = {"on": mps[0], "note": mps[1]}
        out[name] = r
        RESULTS["ray_job"] = out
        save(args.out)
        if mps[0]:
            subprocess.run([shutil.which("nvidia-cuda-mps-control")], input="quit\n", text=True)
    return out


@section
def decode(args, ctx) -> dict:
    from adjcap.models.decoding import beam_search_fast
    from benchmarks.decoding import demo_captioner, make_prompts, real_captioner

    dev = torch.device(args.device)
    cap = demo_captioner(args.root, Path(tempfile.mkdtemp())) if args.dry_run else real_captioner(dev, torch.float32)
    ctx["captioner"] = cap
    prompts = [p.to(dev) for p in make_prompts(cap, args.shape.decode_images)]
    out = {}
    for tf in ((False,) if args.dry_run else (False, True)):  # TF32 is a CUDA mode: the dry run has none
        tf32(tf)
        for batch in args.shape.decode_batches:
            peak_reset()

            def run():
                return beam_search_fast(cap.gpt, prompts, beam_width=args.shape.beam_width,
                                        max_len=args.shape.max_len, stop_ids=cap.stop_ids, batch_size=batch)

            s = best_of(run, reps=2)
            beams = run()
            toks = sum(b.length for bs in beams for b in bs) / max(1, sum(len(bs) for bs in beams))
            key = f"batch{batch}_{'tf32' if tf else 'fp32'}"
            out[key] = {"images_per_s": round(len(prompts) / s, 1), "s": round(s, 3), "peak_gib": peak_gib(),
                        "mean_tokens": round(toks, 1)}
            print(f"decode {key}: {out[key]}", flush=True)
    tf32(False)
    return out


@section
def decode_rows(args, ctx) -> dict:
    """Continuous batching (``captioner.rows``): live rows and images/s at 64/128/256 image slots x 20 beams
    (the dry run: the demo's tiny IFCap, 2 slots)."""
    from benchmarks.decoding import demo_captioner, real_captioner, rows_probe

    dry, dev = args.dry_run, torch.device(args.device)
    cap = demo_captioner(args.root, Path(tempfile.mkdtemp())) if dry else real_captioner(dev, torch.float32, 12.0)
    return rows_probe(cap, dev, (2,) if dry else (64, 128, 256), 4 if dry else 1024)


@section
def clip(args, ctx) -> dict:
    from adjcap.models.roles import load_retrieval_encoder

    cfg = job_config(args, ctx, "fp32")
    out = {}
    n = args.shape.clip_images
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
        tf32(False)
        texts = ["a man riding a wave on top of a surfboard"] * args.shape.clip_texts
        for reps in (1, 4):  # ~10 and ~37 tokens: the padded length is what the tower pays for
            tt = [" ".join([t] * reps) for t in texts]
            s = best_of(lambda: enc.encode_texts(tt, normalize=True), reps=3)
            out[f"text_{prec}_len{reps}x"] = {"texts_per_s": round(len(tt) / s, 1)}
        enc = x = None  # freed before the next precision loads
        peak_reset()
    return out


@section
def attention(args, ctx) -> dict:
    import torch.nn.functional as F

    out = {}
    b = args.shape.attention_batch
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


@section
def index(args, ctx) -> dict:
    from adjcap.index.search import CaptionIndex

    n = args.shape.index_captions
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


@section
def capture(args, ctx) -> dict:
    """The fast beam with its step eager and under torch.compile, passed as the loaded captioner passes it
    (``captioner.compile``: ``beam_search_fast(step=)``), nothing patched."""
    from adjcap.models import decoding
    from adjcap.models.decoding import beam_search_fast
    from benchmarks.decoding import demo_captioner, make_prompts, real_captioner

    dev = torch.device(args.device)
    cap = ctx.get("captioner") or (demo_captioner(args.root, Path(tempfile.mkdtemp())) if args.dry_run
                                   else real_captioner(dev, torch.float32))
    prompts = [p.to(dev) for p in make_prompts(cap, args.shape.decode_images)]
    batch = max(args.shape.decode_batches)
    out = {}

    def run(step=None):
        return beam_search_fast(cap.gpt, prompts, beam_width=args.shape.beam_width, max_len=args.shape.max_len,
                                stop_ids=cap.stop_ids, batch_size=batch, step=step)

    ref = [[(b.tokens, b.finished) for b in bs] for bs in run()]
    out["eager_s"] = round(best_of(run, reps=2), 3)
    modes = ("eager-backend",) if args.dry_run else ("default", "reduce-overhead")
    for mode in modes:
        if over_budget(args):
            out[mode] = "skipped: over the time budget"
            continue
        torch._dynamo.reset()
        # "default" is what captioner.compile=default runs (decoding.beam_step); the others are probed here only
        if mode == "default":
            step = decoding.beam_step("default", dev)
        elif mode == "eager-backend":  # the dry run: dynamo's graph (breaks, guards), no code generation
            step = torch.compile(decoding._gpt_step, fullgraph=True, dynamic=True, backend="eager")
        else:
            step = torch.compile(decoding._gpt_step, fullgraph=True, dynamic=True, mode=mode)
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


# ------------------------------------------------------------------------------------------------


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True,
                    help="the JSON file (a directory: gpu_probe.json in it)")
    ap.add_argument("--dry-run", action="store_true", help="every section on CPU at tiny shapes (the demo world)")
    ap.add_argument("--root", type=Path, default=None,
                    help="where the checkpoints and data go (default /tmp/adjcap-realsize; the dry run: a temp dir, "
                         "or a cache holding the demo world)")
    ap.add_argument("--device", default=None, help="default cuda (the dry run: cpu)")
    ap.add_argument("--judges", default="headline", choices=["headline", "cpu-16gb"])
    ap.add_argument("--variants", nargs="+", default=None, choices=list(VARIANTS),
                    help="the stages section's variants (default: all)")
    ap.add_argument("--sections", nargs="+", default=None, choices=list(SECTIONS))
    ap.add_argument("--budget-s", type=float, default=420.0, help="start no section after this many seconds")
    args = ap.parse_args(argv)
    args.shape = DRY if args.dry_run else Shapes()
    args.device = args.device or ("cpu" if args.dry_run else "cuda")
    if args.root is None and args.dry_run:
        args.root = Path(tempfile.mkdtemp(prefix="gpu-probe-"))
        world = os.environ.get("ADJCAP_TEST_WORLD")  # a demo world built once (tests/prebuild.py): linked, not built
        for sub in ("demo", "tiny"):
            if world and (Path(world) / sub).is_dir():
                (args.root / sub).symlink_to(Path(world) / sub, target_is_directory=True)
    args.root = args.root or Path("/tmp/adjcap-realsize")
    args.sections = args.sections or list(SECTIONS)
    args.variants = args.variants or list(VARIANTS)
    REPS[0] = args.shape.reps
    if args.out.suffix != ".json":
        args.out = args.out / "gpu_probe.json"
    return args


def main(argv: list[str] | None = None) -> dict:
    global T0
    T0 = time.perf_counter()
    RESULTS.clear()
    args = parse(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    RESULTS["command"] = " ".join(["python", "benchmarks/gpu_probe.py", *(argv if argv is not None else sys.argv[1:])])
    ctx: dict = {}
    threads = torch.get_num_threads()
    if args.dry_run:
        torch.set_num_threads(1)  # tiny shapes: one thread computes them, more only spin (a shared CPU)
    try:
        run_sections(args, ctx)
    finally:
        torch.set_num_threads(threads)
    print(json.dumps(RESULTS, indent=1, default=str)[-6000:], flush=True)
    return RESULTS


def run_sections(args, ctx: dict) -> None:
    for name in args.sections:
        if name not in ("env", "assets") and over_budget(args):
            RESULTS[name] = "skipped: over the time budget"
            continue
        t, c = time.perf_counter(), time.process_time()
        print(f"== {name} (at {t - T0:.0f}s)", flush=True)
        try:
            RESULTS[name] = SECTIONS[name](args, ctx)
        except Exception as e:  # noqa: BLE001
            RESULTS[name] = {"error": f"{type(e).__name__}: {e}"[:1500], "traceback": traceback.format_exc()[-3000:]}
            print(RESULTS[name]["traceback"], flush=True)
        RESULTS.setdefault("section_s", {})[name] = round(time.perf_counter() - t, 1)
        RESULTS.setdefault("section_cpu_s", {})[name] = round(time.process_time() - c, 1)  # all threads
        save(args.out)
        if name == "assets" and isinstance(RESULTS[name], dict) and "error" in RESULTS[name]:
            break  # nothing else can run without the checkpoints


if __name__ == "__main__":
    main()

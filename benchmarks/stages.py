"""Time each stage of the pipeline per image, and the corpus encode per caption.

    python benchmarks/stages.py            # the demo world with the tiny models, on CPU
    python benchmarks/stages.py --real     # real-size architectures with random weights (needs CUDA):
                                           # ViT-bigG-14 retrieval, BLIP ITM large, IFCap (GPT-2 +
                                           # mapping net) with a ViT-B-32, a 566,747 x 1280 fp16 index

Calls the same stage functions as the Ray actors (adjcap.engine.stages) on batches of decoded images and
prints images/s per stage (captions/s for the corpus encode). Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adjcap.engine import image_state  # noqa: E402
from adjcap.engine import stages  # noqa: E402
from adjcap.config import load_config  # noqa: E402
from adjcap.models.clip import padded_token_fraction  # noqa: E402
from adjcap.models.roles import CaptionerRole, ScorerRole  # noqa: E402
from adjcap.engine.pipeline import Models, load_models  # noqa: E402
from adjcap.engine.stage_registry import SearchIndex  # noqa: E402


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _time(fn) -> float:
    _sync()
    t = time.perf_counter()
    fn()
    _sync()
    return time.perf_counter() - t


def bench_stages(label: str, models: Models, cfg, states_factory, n_images: int, batch: int) -> dict[str, float]:
    """Warm up once, then time every stage over n_images in batches; returns images/s per stage."""
    warm = states_factory(min(batch, n_images))
    stages.retrieve(warm, models.retrieval, models.index, models.index.texts, cfg.retrieval.top_l)
    stages.verify(warm, models.verifier, cfg.verifier.keep)
    c = models.captioner
    stages.caption(warm, c.captioner, c.clip, cfg.captioner, c.vocabulary)
    stages.score(warm, models.retrieval, models.verifier)
    totals = {"retrieve": 0.0, "verify": 0.0, "caption": 0.0, "score": 0.0}
    for start in range(0, n_images, batch):
        st = states_factory(min(batch, n_images - start))
        totals["retrieve"] += _time(lambda: stages.retrieve(st, models.retrieval, models.index, models.index.texts,
                                                             cfg.retrieval.top_l))
        totals["verify"] += _time(lambda: stages.verify(st, models.verifier, cfg.verifier.keep))
        totals["caption"] += _time(lambda: stages.caption(st, c.captioner, c.clip, cfg.captioner, c.vocabulary))
        totals["score"] += _time(lambda: stages.score(st, models.retrieval, models.verifier))
        errors = [s.error for s in st if s.error]
        if errors:
            print(f"  ({len(errors)} images failed: {errors[0]})")
    whole = sum(totals.values())
    print(f"\n{label}: {n_images} images, batch {batch}")
    for k, v in totals.items():
        print(f"  {k:9s} {v / n_images * 1000:9.2f} ms/image  {n_images / v:9.2f} images/s")
    print(f"  {'total':9s} {whole / n_images * 1000:9.2f} ms/image  {n_images / whole:9.2f} images/s")
    return {k: n_images / v for k, v in totals.items()}


def tiny(args) -> None:
    from adjcap.jobs.demo import prepare
    from adjcap.engine.run_plan import read_records

    with tempfile.TemporaryDirectory() as tmp:
        cfg = load_config("demo", [f"paths.cache_dir={args.cache or tmp}", "device=cpu",
                                   f"retrieval.encoder.text_token_budget={args.token_budget}",
                                   f"verifier.text_token_budget={args.itm_token_budget}"])
        prepare(cfg)
        cfg = cfg.resolved()
        models = load_models(cfg)
        recs = read_records(cfg)["test"]

        def factory(n: int):
            chosen = [recs[i % len(recs)] for i in range(n)]
            return [image_state.decode_state(r.image_id, cfg.benchmark, r.split, r.domain, r.image_path) for r in chosen]

        enc = models.retrieval  # also the scorer's text tower in the demo
        enc.text_token_counts[:] = [0, 0]
        models.verifier.text_token_counts[:] = [0, 0]
        rates = bench_stages("tiny models, cpu (demo world)", models, cfg, factory, args.images, args.batch)
        print(f"  stages' text batches (retrieval/scorer tower, token budget {args.token_budget or 'off'}): "
              f"padded_token_fraction {padded_token_fraction(enc.text_token_counts):.3f}")
        print(f"  ITM text side (verify + score, token budget {args.itm_token_budget or 'off'}): "
              f"padded_token_fraction {padded_token_fraction(models.verifier.text_token_counts):.3f}")
        reads = host_reads_per_batch(models, cfg, factory, args.batch)
        if args.json:
            Path(args.json).write_text(json.dumps({
                "command": " ".join(["python", *sys.argv]), "device": "cpu", "images": args.images,
                "batch": args.batch, "images_per_s": {k: round(v, 2) for k, v in rates.items()},
                "host_reads_per_batch": {"images": [max(1, args.batch // 3), args.batch], **reads}}, indent=1))
        texts = list(models.index.texts)
        enc.text_token_counts[:] = [0, 0]
        dt = _time(lambda: enc.encode_texts(texts, normalize=True))
        print(f"  corpus encode: {len(texts)} captions in {dt:.2f}s = {len(texts) / dt:.0f} captions/s, "
              f"padded_token_fraction {padded_token_fraction(enc.text_token_counts):.3f}")
        padding_by_budget(enc, texts)


def host_reads_per_batch(models: Models, cfg, states_factory, batch: int) -> dict[str, list[int]]:
    """Host reads (adjcap.models.dispatch_audit) of one batch of each stage, and of a batch of a third of the
    size: equal counts mean reads per batch, not per image."""
    from adjcap.engine import stage_registry
    from adjcap.models.dispatch_audit import DispatchAudit

    counts = {}
    for n in (max(1, batch // 3), batch):
        st = states_factory(n)
        for stage in stage_registry.stages():
            audit = DispatchAudit()
            with audit:
                stage.run(st, vars(models), cfg)
            counts.setdefault(stage.name, []).append(sum(audit.reads.values()))
    print(f"  host reads per batch of {max(1, batch // 3)} / {batch} images: "
          + ", ".join(f"{k} {a} / {b}" for k, (a, b) in counts.items()))
    return counts


def padding_by_budget(enc, texts: list[str], budgets=(None, 16384, 4096, 1024)) -> None:
    """padded_token_fraction of these texts' batches for a few token budgets (arithmetic on the
    tokenised lengths; nothing is encoded)."""
    from adjcap.models.clip import text_batches

    lengths = enc.tokenize(texts).lengths
    for budget in budgets:
        batches = text_batches(lengths, enc.text_batch_size, budget)
        real = sum(int(lengths[b].sum()) for b in batches)
        padded = sum(int(lengths[b].max()) * len(b) for b in batches)
        print(f"    token budget {budget}: {len(batches)} batches, padded_token_fraction "
              f"{padded_token_fraction([real, padded]):.3f}")


def real(args) -> None:
    from PIL import Image

    from adjcap.index import CaptionIndex
    from adjcap.models.clip import load_dual_encoder
    from benchmarks.decoding import real_captioner
    from benchmarks.encoders import captions, real_verifier

    dev = torch.device("cuda")
    cfg = load_config("headline", ["device=cuda", "captioner.entities.mode=none"]).resolved()
    retrieval = load_dual_encoder("ViT-bigG-14", None, device="cuda", precision="bf16")
    clip = load_dual_encoder("ViT-B-32", None, device="cuda", precision="fp16")
    verifier = real_verifier(dev)
    captioner = real_captioner(dev, torch.float32)
    n = 566_747
    rng = np.random.default_rng(0)
    vecs = rng.standard_normal((n, retrieval.embed_dim), dtype=np.float32)
    index = CaptionIndex.from_arrays(vecs, device="cuda", precision="fp16")
    corpus = captions(4096)
    corpus_texts = [corpus[i % len(corpus)] for i in range(n)]
    models = Models(retrieval=retrieval, index=SearchIndex(index, corpus_texts), verifier=verifier,
                    captioner=CaptionerRole(captioner, clip), scorer=ScorerRole(retrieval, True, None, verifier))
    images = [Image.fromarray(rng.integers(0, 255, (480, 640, 3), dtype=np.uint8)) for _ in range(16)]

    def factory(k: int):
        st = [image_state.ImageState(image_id=str(i), benchmark="bench", split="test") for i in range(k)]
        for i, s in enumerate(st):
            s.image = images[i % len(images)]
        return st

    bench_stages(f"real-size random weights, {torch.cuda.get_device_name()}", models, cfg, factory,
                 args.images, args.batch)
    sample = corpus_texts[:65536]
    dt = _time(lambda: retrieval.encode_texts(sample, normalize=True))
    print(f"  corpus encode (bigG text, bf16): {len(sample) / dt:.0f} captions/s "
          f"-> {n / (len(sample) / dt):.0f}s for the 566,747-caption corpus")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--real", action="store_true", help="real-size random-weight models on CUDA")
    ap.add_argument("--images", type=int, default=48)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--cache", default=None, help="tiny: a demo cache to reuse (default: built in a temp dir)")
    ap.add_argument("--token-budget", type=int, default=0, help="tiny: retrieval.encoder.text_token_budget")
    ap.add_argument("--itm-token-budget", type=int, default=0, help="tiny: verifier.text_token_budget")
    ap.add_argument("--json", default=None, help="tiny: also write the rates and host reads here")
    args = ap.parse_args()
    torch.manual_seed(0)
    if args.real:
        if not torch.cuda.is_available():
            sys.exit("--real needs a CUDA device")
        real(args)
    else:
        tiny(args)


if __name__ == "__main__":
    main()

"""Benchmark: fit TriFuse and MemAttend on a synthetic 5,000-image x 20-candidate feature table.

    .venv/bin/python benchmarks/rerank.py                 # paper schedule: 100 + 200 epochs, default batch
    .venv/bin/python benchmarks/rerank.py --threads 2 --images 1000 --batch-images 0   # full batch
    .venv/bin/python benchmarks/rerank.py --device cuda  # on a GPU
    .venv/bin/python benchmarks/rerank.py --study full,32,64,128,256 --json study.json
        # choose rerank.batch_images: fit both heads per batch size, report the Borda pseudo-label
        # loss on a held-out synthetic table (--holdout images, another seed); never references

Goes through the same path as a run: feature rows -> Arrow table -> load_features -> fit -> pick.
Prints wall-clock and process CPU seconds per phase, and the machine's load average (on a shared
machine other processes slow the wall clock down; the CPU seconds are the less noisy number).
The one-time cost of torch's first optimizer construction (it imports torch._dynamo) is measured
separately as "warm-up" and is not part of the fit times.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from adjcap.config import MemAttendCfg, RerankCfg, TriFuseCfg  # noqa: E402
from adjcap.engine.features import rows_to_table  # noqa: E402
from adjcap.rerank import (  # noqa: E402
    Heads,
    agreement,
    borda_targets,
    fit_memattend,
    fit_trifuse,
    head_scores,
    listwise_loss,
    load_features,
    pick,
)
from adjcap.demo.synthetic import synthetic_feature_rows  # noqa: E402


class Timer:
    def __init__(self) -> None:
        self.rows: list[tuple[str, float, float]] = []

    def __call__(self, name: str):
        timer = self

        class _Ctx:
            def __enter__(self):
                self.w, self.c = time.perf_counter(), time.process_time()

            def __exit__(self, *exc):
                timer.rows.append((name, time.perf_counter() - self.w, time.process_time() - self.c))
                print(f"{name:<28} wall {timer.rows[-1][1]:8.2f} s   cpu {timer.rows[-1][2]:8.2f} s", flush=True)

        return _Ctx()


def machine_gflops(seconds: float = 1.0) -> float:
    """Single-thread fp32 GEMM rate right now: a yardstick for how fast this (shared) machine runs."""
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        torch.mm(a, b)
        n += 1
    torch.set_num_threads(prev)
    return n * 2 * 256**3 / (time.perf_counter() - t0) / 1e9


def heldout(feats, head) -> dict[str, float]:
    """Borda pseudo-label loss of ``head`` on held-out ``feats`` and top-1 agreement with the Borda argmax."""
    _, target = borda_targets(feats.raw_scores, feats.mask)
    s = head_scores(feats, head)
    loss = float(listwise_loss(s, target, feats.mask))
    top = s.masked_fill(~feats.mask, float("-inf")).argmax(1)
    return {"loss": loss, "top1_borda": float((top == target.argmax(1)).double().mean())}


def study(args, feats) -> None:
    hold = load_features(rows_to_table(synthetic_feature_rows(args.holdout, args.candidates, seed=2)))
    out = []
    for b in args.study.split(","):
        bi = None if b == "full" else int(b)
        cfg = RerankCfg(
            trifuse=TriFuseCfg(epochs=args.trifuse_epochs),
            memattend=MemAttendCfg(epochs=args.memattend_epochs),
            batch_images=bi,
            threads=args.threads or None,
        )
        row = {"batch_images": bi}
        for name, fn in (("trifuse", fit_trifuse), ("memattend", fit_memattend)):
            w, c = time.perf_counter(), time.process_time()
            f = fn(feats, cfg, seed=42, device=args.device)
            row[name] = {
                "wall_s": time.perf_counter() - w,
                "cpu_s": time.process_time() - c,
                "train_loss_last": f.losses[-1],
                **heldout(hold, f.head),
            }
        out.append(row)
        print(
            f"batch {b:>5}: " + "; ".join(
                f"{n} held-out loss {row[n]['loss']:.4f} top-1 {row[n]['top1_borda']:.3f} "
                f"(wall {row[n]['wall_s']:.0f} s, cpu {row[n]['cpu_s']:.0f} s)" for n in ("trifuse", "memattend")
            ) + f"; load average {os.getloadavg()[0]:.2f}",
            flush=True,
        )
        if args.json:
            args.json.write_text(json.dumps({"train_images": feats.n_images, "holdout_images": hold.n_images,
                                             "rows": out}, indent=2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=5000)
    ap.add_argument("--candidates", type=int, default=20)
    ap.add_argument("--threads", type=int, default=0, help="fit worker threads (0 = every available CPU)")
    ap.add_argument("--trifuse-epochs", type=int, default=TriFuseCfg().epochs)
    ap.add_argument("--memattend-epochs", type=int, default=MemAttendCfg().epochs)
    ap.add_argument("--batch-images", type=int, default=RerankCfg().batch_images or 0,
                    help="images per optimiser step; 0 = full batch (default: rerank.batch_images)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    ap.add_argument("--json", type=Path, default=None, help="also write the timings here")
    ap.add_argument("--study", default="", help="comma list of batch sizes (or 'full') to compare on held-out loss")
    ap.add_argument("--holdout", type=int, default=1000, help="held-out images for --study")
    args = ap.parse_args()
    cfg = RerankCfg(
        trifuse=TriFuseCfg(epochs=args.trifuse_epochs),
        memattend=MemAttendCfg(epochs=args.memattend_epochs),
        batch_images=args.batch_images or None,
        threads=args.threads or None,
    )

    print(
        f"torch {torch.__version__}, {os.cpu_count()} CPUs visible, fit threads {args.threads or 'all'}, "
        f"device {args.device}, images per step {cfg.batch_images or 'all (full batch)'}, "
        f"load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    speed_before = machine_gflops()
    print(f"machine yardstick: {speed_before:.1f} GFLOP/s single-thread GEMM", flush=True)
    t = Timer()
    with t("synthetic rows -> Arrow"):
        table = rows_to_table(synthetic_feature_rows(args.images, args.candidates, seed=1))
    with t("load_features"):
        feats = load_features(table)
    with t("warm-up (torch.optim import)"):
        torch.optim.Adam(torch.nn.Linear(1, 1).parameters())
    if args.study:
        return study(args, feats)
    with t(f"fit TriFuse x{args.trifuse_epochs}"):
        tri = fit_trifuse(feats, cfg, seed=42, device=args.device)
    with t(f"fit MemAttend x{args.memattend_epochs}"):
        mem = fit_memattend(feats, cfg, seed=42, device=args.device)
    heads = Heads(trifuse=tri.head, memattend=mem.head)  # type: ignore[arg-type]
    with t("pick ensemble (all images)"):
        idx = pick(feats, "ensemble", heads)
    fit_wall = sum(r[1] for r in t.rows if r[0].startswith("fit "))
    fit_cpu = sum(r[2] for r in t.rows if r[0].startswith("fit "))
    print(
        f"\nFIT BOTH HEADS on {feats.n_images} images x {args.candidates} candidates: "
        f"{fit_wall:.1f} s wall, {fit_cpu:.1f} s CPU "
        f"(TriFuse loss {tri.losses[0]:.3f} -> {tri.losses[-1]:.3f}, "
        f"MemAttend loss {mem.losses[0]:.3f} -> {mem.losses[-1]:.3f}; "
        f"top-1 agreement of the heads {agreement(pick(feats, 'trifuse', heads), pick(feats, 'memattend', heads)):.2f}; "
        f"{len(idx)} picks); load average now {os.getloadavg()[0]:.2f}; "
        f"yardstick {speed_before:.1f} -> {machine_gflops():.1f} GFLOP/s",
        flush=True,
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "images": feats.n_images,
                    "candidates": args.candidates,
                    "threads": args.threads,
                    "device": mem.device,
                    "batch_images": cfg.batch_images,
                    "phases": [{"name": n, "wall_s": w, "cpu_s": c} for n, w, c in t.rows],
                    "fit_wall_s": fit_wall,
                    "fit_cpu_s": fit_cpu,
                    "losses": {"trifuse": tri.losses, "memattend": mem.losses},
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()

"""`make demo`: build the demo world and the tiny models, then the main job end to end on a local Ray:
encode-corpus -> run-job -> fit -> evaluate -> report."""

from __future__ import annotations

from pathlib import Path

from adjcap.config import Config
from adjcap.demo.tiny import build_tiny_world
from adjcap.demo.world import build_demo_world, demo_corpus_texts
from jobs import run_benchmark


def prepare(cfg: Config) -> None:
    demo_root = cfg.cache_dir / "demo"
    build_demo_world(demo_root, seed=cfg.seed)
    build_tiny_world(cfg.cache_dir, demo_corpus_texts(demo_root), seed=cfg.seed)


def main(cfg: Config, run_dir: Path) -> Path:
    prepare(cfg)
    out = run_benchmark.main(cfg, run_dir=run_dir, resume=True, evaluate=True)
    print(f"report: {Path(out) / 'report.md'} and {Path(out) / 'report.html'}")
    print(out)
    return out

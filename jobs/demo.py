"""`make demo`: build the demo world and its tiny models (cached), then the main job end to end on a
local Ray: encode-corpus -> run-job -> fit -> evaluate -> report."""

from __future__ import annotations

from pathlib import Path

from adjcap.config import Config
from adjcap.demo.tiny import build_tiny_world
from adjcap.demo.world import build_demo_world, demo_corpus_texts
from adjcap.rundir import RunDir
from jobs import run


def prepare(cfg: Config) -> None:
    """The demo world and tiny models under ``{cache}`` (built once, then reused)."""
    cache = Path(cfg.resolved().paths.cache_dir)
    build_demo_world(cache / "demo", seed=cfg.seed)
    build_tiny_world(cache, demo_corpus_texts(cache / "demo"), seed=cfg.seed)


def prepare_if_demo(cfg: Config) -> None:
    """The demo world and its tiny models when ``cfg`` uses them (its benchmark is the demo world)."""
    if cfg.benchmark == "demo":
        prepare(cfg)


def main(cfg: Config, run_dir: str | Path | None = None, resume: bool = True, evaluate_after: bool = True) -> RunDir:
    prepare(cfg)
    out = run.main(cfg, run_dir=run_dir, resume=resume, evaluate_after=evaluate_after)
    print(f"report: {out.report_md} and {out.report_html}")
    print(out.path)
    return out

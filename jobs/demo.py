"""`make demo`: build the demo world and its tiny models (cached), then the main job end to end on a
local Ray: encode-corpus -> run-job -> fit -> evaluate -> report."""

from __future__ import annotations

from pathlib import Path

from adjcap.config import Config, load_config
from adjcap.demo.tiny import build_tiny_world
from adjcap.demo.world import build_demo_world, demo_corpus_texts
from adjcap.rundir import RunDir
from jobs import run


# the demo preset's model and data keys: what `on_demo_world` swaps into another preset
DEMO_WORLD_KEYS = (
    "benchmark", "retrieval.encoder", "retrieval.shard_size", "retrieval.index_precision",
    "verifier.model", "verifier.batch_size",
    "captioner.checkpoint", "captioner.tokenizer", "captioner.lm_config", "captioner.mapping_heads",
    "captioner.max_len", "captioner.batch_size", "captioner.clip",
    "captioner.entities.tagger", "captioner.entities.vocabulary",
    "eval.clipscore", "eval.spice", "ray",
)


def on_demo_world(cfg: Config) -> Config:
    """``cfg``'s method settings (verifier on/off, L, k, K, beam, decoder, entity mode, picker, protocol,
    splits, precision) on the demo world: the demo preset's model and data keys replace ``cfg``'s;
    ``paths``, ``limit`` and the name are kept. An output scorer of its own (``scorer.encoder``)
    becomes the demo's captioner CLIP, loaded apart from the retrieval encoder, so the path that does
    not reuse stage 1's image embedding still runs (the demo's two tiny CLIP files hold the same weights)."""
    demo = load_config("demo").model_dump(mode="json")
    data = cfg.model_dump(mode="json")
    for key in DEMO_WORLD_KEYS:
        *parents, last = key.split(".")
        src, dst = demo, data
        for p in parents:
            src, dst = src[p], dst[p]
        dst[last] = src[last]
    if cfg.scorer.encoder is not None:
        data["scorer"]["encoder"] = demo["captioner"]["clip"]
    return Config.model_validate(data)


def prepare(cfg: Config) -> None:
    """The demo world and tiny models under ``{cache}`` (built once, then reused)."""
    cache = Path(cfg.resolved().paths.cache_dir)
    build_demo_world(cache / "demo", seed=cfg.seed)
    build_tiny_world(cache, demo_corpus_texts(cache / "demo"), seed=cfg.seed)


def main(cfg: Config, run_dir: str | Path | None = None, resume: bool = True, evaluate_after: bool = True) -> RunDir:
    prepare(cfg)
    out = run.main(cfg, run_dir=run_dir, resume=resume, evaluate_after=evaluate_after)
    print(f"report: {out.report_md} and {out.report_html}")
    print(out.path)
    return out

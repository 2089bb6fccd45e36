"""`make demo`: build the demo world and its tiny models (cached), then the main job end to end on a
local Ray: encode-corpus -> run-job -> fit -> evaluate -> report."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from adjcap.models import lavis_env
from adjcap.config import Config, load_config
from adjcap.demo.tiny import QUALITY, build_tiny_world
from adjcap.demo.tiny_judges import JUDGE_DIRS, build_tiny_judge, judge_config, judge_ready
from adjcap.demo.tiny_lavis import build_tiny_lavis
from adjcap.demo.train_hf_captioner import FOLDER as TINY_CAPTIONER, ensure_tiny_captioner
from adjcap.demo.tiny_vlm import FOLDER as TINY_VLM, ensure_tiny_vlm
from adjcap.demo.world import build_demo_world, demo_corpus_texts
from adjcap.storage.rundir import RunDir
from adjcap.jobs import run
from adjcap.jobs.executors import executor_problem
from adjcap.jobs.preflight import PreflightError


# the demo preset's model and data keys: what `on_demo_world` swaps into another preset
DEMO_WORLD_KEYS = (
    "benchmark", "retrieval.encoder", "retrieval.shard_size", "retrieval.index_precision",
    "verifier.family", "verifier.model", "verifier.pretrained", "verifier.batch_size",
    "captioner.checkpoint", "captioner.tokenizer", "captioner.lm_config", "captioner.mapping_heads",
    "captioner.max_len", "captioner.batch_size", "captioner.clip",
    "captioner.entities.tagger", "captioner.entities.vocabulary",
    "eval.clipscore", "eval.spice", "ray",
)


def on_demo_world(cfg: Config) -> Config:
    """``cfg``'s method settings (verifier on/off, L, k, K, beam, decoder, entity mode, picker, protocol,
    splits, precision, TF32, token budgets) on the demo world: the demo preset's model and data keys
    replace ``cfg``'s;
    ``paths``, ``limit`` and the name are kept. An output scorer of its own (``scorer.encoder``)
    becomes the demo's captioner CLIP, loaded apart from the retrieval encoder, so the path that does
    not reuse stage 1's image embedding still runs (the small tiny CLIP, as the paper's ViT-B/32 scorer is
    smaller than its bigG retrieval encoder)."""
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
    for section in ("retrieval.encoder", "captioner.clip", "eval.clipscore", "scorer.encoder"):
        *parents, last = section.split(".")
        src, dst = cfg.model_dump(mode="json"), data
        for p in parents:
            src, dst = src[p], dst[p]
        if src.get(last) and dst.get(last):  # a speed setting of the preset's own, kept on the demo's models
            dst[last]["text_token_budget"] = src[last]["text_token_budget"]
    return Config.model_validate(data)


def prepare(cfg: Config) -> Config:
    """The demo world and tiny models under ``{cache}`` (built once, then reused); prints what each
    step took (wall and this process's CPU seconds) and the judges' held-out quality. Returns ``cfg``,
    with the tiny LAVIS judge as its verifier when it asks for the ``lavis`` backend on the demo's own
    (transformers) judge."""
    rcfg = cfg.resolved()  # an edge of its own: the world is built before any job plans its run
    why = executor_problem(rcfg)  # a setting no build below can mend: refused before building anything
    if why:
        raise PreflightError(f"preset '{cfg.name}' cannot run here: {why}")
    cache = Path(rcfg.paths.cache_dir)
    with _step("demo world"):
        build_demo_world(cache / "demo", seed=cfg.seed)
    with _step("tiny models"):
        paths = build_tiny_world(cache, demo_corpus_texts(cache / "demo"), seed=cfg.seed)
    q = json.loads((paths["vocabulary"].parent / QUALITY).read_text())
    r, v = q["retrieval_clip"], q["blip_itm"]
    print(f"demo judges on {q['images']} held-out scenes: retrieval CLIP recall@1/5 {r['i2t_r@1']:.2f}/{r['i2t_r@5']:.2f} "
          f"(captioner CLIP {q['captioner_clip']['i2t_r@1']:.2f}/{q['captioner_clip']['i2t_r@5']:.2f}), "
          f"BLIP ITM accuracy {v['accuracy']:.2f}")
    second_captioner(cfg, rcfg)
    tiny_judge(rcfg)
    return _lavis_judge(cfg, rcfg, paths["blip"])


def second_captioner(cfg: Config, rcfg: Config) -> None:
    """The demo's tiny BLIP captioner (the ``hf`` family, :mod:`adjcap.demo.train_hf_captioner`) or tiny
    LLaVA (the ``vlm`` family, :mod:`adjcap.demo.tiny_vlm`) when ``cfg`` captions with it: trained on first use (a few CPU minutes), then reused; nothing otherwise
    (``make demo`` captions with IFCap and never trains it). ``rcfg``: ``cfg`` resolved."""
    cache = Path(rcfg.paths.cache_dir)
    if rcfg.captioner.family == "vlm" and Path(rcfg.captioner.vlm.model) == cache / "tiny" / TINY_VLM:
        with _step("tiny LLaVA (vlm captioner family)"):
            ensure_tiny_vlm(cache, demo_corpus_texts(cache / "demo"), seed=cfg.seed)
        return
    if rcfg.captioner.family != "hf" or Path(rcfg.captioner.hf.model) != cache / "tiny" / TINY_CAPTIONER:
        return
    with _step("tiny BLIP captioner (second captioner family)"):
        ensure_tiny_captioner(cache, demo_corpus_texts(cache / "demo"), seed=cfg.seed)


def tiny_judge(rcfg: Config) -> None:
    """The demo's tiny judge of ``verifier.family`` (BLIP-2 ITM, SigLIP), built on first use when the
    config's verifier is it (the tiny world must be built: :func:`prepare`). ``rcfg``: resolved."""
    v = rcfg.verifier
    if not v.enabled or v.family not in JUDGE_DIRS:
        return
    cache = Path(rcfg.paths.cache_dir)
    if judge_config(cache, v.family) != {"family": v.family, **({"pretrained": v.pretrained} if v.pretrained else {}),
                                         "model": v.model}:
        return  # the user's own judge
    if not judge_ready(cache, v.family):
        with _step(f"tiny {v.family} judge"):
            build_tiny_judge(cache, v.family, seed=rcfg.seed)


def _lavis_judge(cfg: Config, rcfg: Config, demo_blip: Path) -> Config:
    """``verifier.backend = "lavis"`` needs a LAVIS ``.pth``; on the demo's transformers judge it gets the
    demo's tiny LAVIS BlipITM (built once in the LAVIS environment, which is built first if needed).
    ``rcfg``: ``cfg`` resolved."""
    v = cfg.verifier
    if not (v.enabled and v.backend == "lavis") or Path(rcfg.verifier.model) != demo_blip:
        return cfg
    cache = Path(rcfg.paths.cache_dir)
    with _step("LAVIS environment"):
        lavis_env.build(cache)
    with _step("tiny LAVIS judge"):
        pth, tok = build_tiny_lavis(demo_blip.parent, cache, seed=cfg.seed)
    print(f"verifier.backend=lavis on the demo world: the tiny LAVIS BlipITM {pth} (LAVIS's classes, random "
          "weights: it proves the backend, its verdicts are noise; the trained tiny judge's 16-wide heads have "
          "no LAVIS layout)")
    return cfg.model_copy(update={"verifier": v.model_copy(update={"model": str(pth), "tokenizer": str(tok)})})


@contextlib.contextmanager
def _step(name: str) -> Iterator[None]:
    t, c = time.perf_counter(), time.process_time()
    yield
    print(f"{name}: {time.perf_counter() - t:.1f} s wall, {time.process_time() - c:.1f} s CPU")


def prepare_if_demo(cfg: Config) -> Config:
    """The demo world and its tiny models when ``cfg`` uses them (its benchmark is the demo world)."""
    return prepare(cfg) if cfg.benchmark == "demo" else cfg


def main(cfg: Config, run_dir: str | Path | None = None, resume: bool = True, evaluate_after: bool = True,
         log: Sequence[str] = (), strict: bool = False) -> RunDir:
    cfg = prepare(cfg)
    with _step("run (extract -> fit -> evaluate -> report)"):
        out = run.main(cfg, run_dir=run_dir, resume=resume, evaluate_after=evaluate_after, log=log, strict=strict)
    if evaluate_after:
        print(f"report: {out.report_md} and {out.report_html}")
    print(out.path)
    return out

"""`adjcap doctor`: what this machine has and which weights/data a config would find."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

from adjcap.accelerators import HIP, ROCR, Gpu, backend, rocm_visible_env, visible_gpus
from adjcap.config import Config


def _version(pkg: str) -> str:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return "not installed"


def _java() -> str:
    java = shutil.which("java")
    if not java:
        return "not found (METEOR, the PTB tokenizer and SPICE need Java 11+)"
    out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    return (out.stderr or out.stdout).splitlines()[0] if (out.stderr or out.stdout) else java


def _hf_cached(repo: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo, "config.json"), str)
    except Exception:  # noqa: BLE001
        return False


def _model_status(cfg: Config, value: str | None, kind: str) -> str:
    """``cfg`` resolved: ``value`` is a path, hub id or tag as the loaders will see it."""
    if value is None:
        return "random weights"
    resolved = value
    if resolved and (Path(resolved).exists() or "/" in resolved and Path(resolved).is_absolute()):
        return f"{resolved}: {'found' if Path(resolved).exists() else 'MISSING'}"
    if kind == "hf":
        return f"{value}: {'in HF cache' if _hf_cached(value) else 'not in HF cache (needs a download or a local path)'}"
    return f"{value}: open_clip tag (downloaded on first use unless HF_HUB_OFFLINE=1)"


def report(cfg: Config) -> str:
    import torch

    cfg = cfg.resolved()
    lines = [f"python      {platform.python_version()} ({platform.machine()})",
             f"torch       {torch.__version__}"]
    gpus = visible_gpus()
    if gpus:
        lines.append(f"accelerator {backend()}, {len(gpus)} x {gpus[0].name}")
    else:
        lines.append("accelerator none (CPU only)")
    if rocm_visible_env():
        lines.append(f"            {ROCR} is set without {HIP}: Ray refuses to start so; the Ray jobs set "
                     f"{HIP}={rocm_visible_env()[HIP]} for the local Ray (set it yourself before `ray start`)")
    for pkg in ("ray", "open_clip_torch", "transformers", "pycocoevalcap", "nltk"):
        lines.append(f"{pkg:11s} {_version(pkg)}")
    lines.append(f"java        {_java()}")
    try:
        from adjcap.metrics.spice import spice_status

        lines.append(f"spice       {spice_status(cfg.resolved().eval)}")
    except Exception as e:  # noqa: BLE001
        lines.append(f"spice       unknown ({e})")
    lines.append(f"HF offline  {os.environ.get('HF_HUB_OFFLINE', '0')}")
    lines.append("")
    lines.append(f"config '{cfg.name}' (benchmark {cfg.benchmark}):")
    e = cfg.retrieval.encoder
    lines.append(f"  retrieval encoder  {e.model} / {_model_status(cfg, e.pretrained, 'clip')}")
    if cfg.verifier.enabled:
        lines.append(f"  verifier           {_model_status(cfg, cfg.verifier.model, 'hf')}")
    from adjcap import lavis_env

    lines.append(f"  LAVIS environment  {lavis_env.status(cfg.paths.cache_dir)}"
                 f"{' (verifier.backend=lavis)' if cfg.verifier.backend == 'lavis' else ''}")
    lines.append(f"  IFCap checkpoint   {_model_status(cfg, cfg.captioner.checkpoint, 'file')}")
    lines.append(f"  IFCap CLIP         {cfg.captioner.clip.model} / {_model_status(cfg, cfg.captioner.clip.pretrained, 'clip')}")
    lines.append(f"  GPT-2 tokenizer    {_model_status(cfg, cfg.captioner.tokenizer, 'hf')}")
    for role, enc in (("output scorer", cfg.scorer.encoder), ("CLIPScore enc.", cfg.eval.clipscore)):
        if enc is not None:
            lines.append(f"  {role:18s} {enc.model} / {_model_status(cfg, enc.pretrained, 'clip')}")
    b = cfg.benchmarks.get(cfg.benchmark)
    if b:
        for split in cfg.splits:
            ann = b.annotations_by_split.get(split, b.annotations)
            lines.append(f"  {split:5s} references {_model_status(cfg, ann, 'file')}")
        lines.append(f"  images             {_model_status(cfg, b.images, 'file')}")
        if b.corpus:
            lines.append(f"  corpus             {_model_status(cfg, b.corpus, 'file')}")
    lines.append("")
    lines.extend(budget_lines(cfg, gpus))
    return "\n".join(lines)


def budget_lines(cfg: Config, gpus: list[Gpu]) -> list[str]:
    """Memory of each pool's models (``cfg`` resolved) and whether one actor of every pool fits on
    one of ``gpus`` (the default GPU shares put one actor of each pool on every GPU)."""
    from adjcap.models.budget import POOLS, pool_budget

    budget = pool_budget(cfg, gpu=bool(gpus))
    where = "on the GPU" if gpus else "on the CPU"
    lines = [f"memory per pool ({where}, weights at the configured precision; activations and the index extra):"]
    for pool in (*POOLS, "encoder"):
        b = budget[pool]
        note = " (adjcap encode-corpus)" if pool == "encoder" else ""
        lines.append(f"  {pool:10s} {b['params'] / 1e6:9.1f} M params  {_gib(b['bytes']):>10s}{note}")
    total = sum(budget[p]["bytes"] for p in POOLS)
    lines.append(f"  one actor of every pool: {_gib(total)}")
    if not gpus:
        lines.append("  no GPU visible: the pools run on the CPU (RAM)")
        return lines
    smallest = min(gpus, key=lambda g: g.total_bytes)
    left = smallest.total_bytes - total
    verdict = (f"fits: {_gib(left)} left for activations and the caption index" if left > 0 else
               f"does NOT fit ({_gib(-left)} short): use bf16/fp16 (retrieval.encoder.precision, verifier.precision, "
               f"captioner.precision) or larger GPUs")
    lines.append(f"  per GPU ({len(gpus)} x {smallest.name}, {_gib(smallest.total_bytes)}): {verdict}")
    return lines


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"

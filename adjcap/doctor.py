"""`adjcap doctor`: what this machine has and which weights/data a config would find."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

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
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
        kind = f"ROCm {torch.version.hip}" if getattr(torch.version, "hip", None) else f"CUDA {torch.version.cuda}"
        lines.append(f"accelerator {kind}, {torch.cuda.device_count()} x {name}")
    else:
        lines.append("accelerator none (CPU only)")
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
    return "\n".join(lines)

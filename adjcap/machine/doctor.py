"""`adjcap doctor`: what this machine has and which weights/data a config would find."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from importlib import metadata

from adjcap.machine import numerics
from adjcap.machine.accelerators import HIP, ROCR, Gpu, backend, mps_status, rocm_visible_env, visible_gpus
from adjcap.config import Config
from adjcap.machine.needs import DEMO_HINT, Need, missing, needs_of


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


BYTECODE_PACKAGES = ("torch", "transformers", "ray")  # what every pool actor imports


def bytecode_status(packages: tuple[str, ...] = BYTECODE_PACKAGES) -> str:
    """Whether the packages every Ray worker imports have their bytecode on disk (or may write it). Without
    it each process compiles them from source: ~24 s of CPU to import open_clip, ray and transformers
    against ~8 s (2-core Xeon), paid by every pool actor, decode worker and command."""
    import importlib.util
    import sys

    if sys.implementation.cache_tag is None:
        return "this Python keeps no bytecode: every process compiles what it imports"
    lacking: dict[str, str] = {}  # package -> the folder it is installed in
    for name in packages:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin and not os.path.exists(importlib.util.cache_from_source(spec.origin)):
            lacking[name] = os.path.dirname(os.path.dirname(spec.origin))
    if not lacking:
        return "ok"
    names = ", ".join(lacking)
    if not sys.dont_write_bytecode:
        return f"not yet for {names} (written on their first import)"
    return (f"MISSING for {names}, and PYTHONDONTWRITEBYTECODE is set: every Ray worker and command compiles "
            f"them from source (~15 s more CPU each); unset it, or run `{sys.executable} -m compileall -q -j 0 "
            f"{next(iter(lacking.values()))}`")


def needs_lines(cfg: Config, needed: list[Need]) -> list[str]:
    """One line per thing the config needs: ok (and where) or MISSING (and how to get it)."""
    lines = [f"config '{cfg.name}' (benchmark {cfg.benchmark}) needs:"]
    for n in needed:
        if n.ok:
            lines.append(f"  ok       {n.what}  ({n.found})")
        else:
            how = f"adjcap prepare --for {cfg.name}" if n.step else n.hint
            lines.append(f"  MISSING  {n.what}  -> {how}")
    return lines


def diagnose(cfg: Config, memory: str | None = None) -> tuple[str, list[str]]:
    """The report and the problems that stop ``cfg`` (resolved) from running here: every missing need
    and ``memory`` (why the pools cannot be placed, from the job's own plan; None: they can)."""
    needed = needs_of(cfg)
    text = report(cfg, needed)
    gone = missing(needed)
    problems = [n.what for n in gone]
    if memory:
        problems.append(f"resource plan: {memory}")
    verdict = (f"\nnot ready: {len(problems)} problem(s): {'; '.join(problems)}" if problems
               else f"\nready: everything preset '{cfg.name}' needs is here")
    if any(n.step for n in gone):
        verdict += f"\nfetch what is missing: adjcap prepare --for {cfg.name}"
    if any(n.hint == DEMO_HINT for n in gone):
        verdict += f"\nbuild what is missing: {DEMO_HINT}"
    return text + verdict, problems


def report(cfg: Config, needed: list[Need] | None = None) -> str:
    """What this machine has and what ``cfg`` (resolved) needs of it."""
    import torch

    lines = [f"python      {platform.python_version()} ({platform.machine()})",
             f"torch       {torch.__version__}"]
    gpus = visible_gpus()
    if gpus:
        lines.append(f"accelerator {backend()}, {len(gpus)} x {gpus[0].name}")
    else:
        lines.append("accelerator none (CPU only)")
    lines.append(f"mps         {mps_status()[1]}")
    if rocm_visible_env():
        lines.append(f"            {ROCR} is set without {HIP}: Ray refuses to start so; the Ray jobs set "
                     f"{HIP}={rocm_visible_env()[HIP]} for the local Ray (set it yourself before `ray start`)")
    for pkg in ("ray", "open_clip_torch", "transformers", "pycocoevalcap", "nltk"):
        lines.append(f"{pkg:11s} {_version(pkg)}")
    lines.append(f"java        {_java()}")
    lines.append(f"bytecode    {bytecode_status()}")
    try:
        from adjcap.java.corenlp import spice_status

        lines.append(f"spice       {spice_status(cfg.eval)}")
    except Exception as e:  # noqa: BLE001
        lines.append(f"spice       unknown ({e})")
    lines.append(f"HF offline  {os.environ.get('HF_HUB_OFFLINE', '0')}")
    problem = numerics.cpu_problem()
    lines.append(f"numerics    {cfg.numerics}" + (
        "" if cfg.numerics != "portable" else
        f": {problem}" if problem else ": this CPU (x86-64, AVX2, FMA) computes the committed demo figures"))
    lines.append("")
    needed = needs_of(cfg) if needed is None else needed
    lines.extend(needs_lines(cfg, needed))
    from adjcap.models import lavis_env

    lines.append(f"  LAVIS environment  {lavis_env.status(cfg.paths.cache_dir)}"
                 f"{' (verifier.backend=lavis)' if cfg.verifier.backend == 'lavis' else ''}")
    lines.append("")
    lines.extend(budget_lines(cfg, gpus))
    return "\n".join(lines)


def budget_lines(cfg: Config, gpus: list[Gpu]) -> list[str]:
    """Memory of each pool's models (``cfg`` resolved) and whether one actor of every pool fits on
    one of ``gpus`` (the default GPU shares put one actor of each pool on every GPU)."""
    from adjcap.engine.pools import pool_budget, pool_names

    budget = pool_budget(cfg, gpu=bool(gpus))
    where = "on the GPU" if gpus else "on the CPU"
    lines = [f"memory per pool ({where}, weights at the configured precision; activations and the index extra):"]
    for pool in (*pool_names(), "fused", "encoder"):
        b = budget[pool]
        note = {"encoder": " (adjcap encode-corpus)", "fused": " (ray.pools=fused: every stage, each model once)"}.get(pool, "")
        lines.append(f"  {pool:10s} {b['params'] / 1e6:9.1f} M params  {_gib(b['bytes']):>10s}{note}")
    total = sum(budget[p]["bytes"] for p in pool_names())
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

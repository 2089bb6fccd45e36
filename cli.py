"""adjcap command line. Parses arguments, resolves the config, calls a job. No logic of its own."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer

from adjcap.config import ConfigError, list_presets, load_config

app = typer.Typer(
    help="Adjudicated Captioning: Ray-distributed batch evaluation of zero-shot image captioning.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

PRESET = typer.Option("headline", "--preset", "-p", help="config preset (adjcap config --list)")
SET = typer.Option(None, "--set", "-s", help="override a config key: --set verifier.model=ID (repeatable)")
CONFIG_FILE = typer.Option(None, "--config", help="a saved config.toml (e.g. runs/x/config.toml) instead of a preset")


def _cfg(preset: str, sets: Optional[List[str]], config_file: Optional[Path], extra: list[str] | None = None):
    try:
        return load_config(None if config_file else preset, [*(sets or []), *(extra or [])], config_file)
    except ConfigError as e:
        typer.secho(f"error: {e}", fg="red", err=True)
        raise typer.Exit(2) from None


@app.command("config")
def config_cmd(
    preset: str = PRESET,
    sets: Optional[List[str]] = SET,
    config_file: Optional[Path] = CONFIG_FILE,
    list_: bool = typer.Option(False, "--list", help="list the presets and exit"),
):
    """Print the resolved config as TOML (or list presets)."""
    if list_:
        for name, desc in list_presets().items():
            typer.echo(f"{name:18s} {desc}")
        return
    typer.echo(_cfg(preset, sets, config_file).to_toml())


@app.command("run-job")
def run_job(
    benchmark: str = typer.Argument(..., help="coco | flickr30k | nocaps | demo | a configured benchmark name"),
    workers: int = typer.Option(None, "--workers", "-w", help="actors per pool (default: config ray.workers)"),
    preset: Optional[str] = typer.Option(None, "--preset", "-p",
                                         help="config preset (default: headline; demo for the demo benchmark)"),
    sets: Optional[List[str]] = SET,
    config_file: Optional[Path] = CONFIG_FILE,
    limit: Optional[int] = typer.Option(None, help="only the first N images of each split"),
    address: Optional[str] = typer.Option(None, help="existing Ray cluster (ray://... or auto); default: local Ray"),
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="output directory (default runs/<preset>-<benchmark>)"),
    resume: bool = typer.Option(True, "--resume/--fresh", help="skip images already written / start over"),
    evaluate: bool = typer.Option(True, "--evaluate/--no-evaluate", help="fit, predict and evaluate after the features"),
):
    """Stream a benchmark through the four actor pools, write features, fit, predict, evaluate."""
    from jobs import run_benchmark

    extra = [f"benchmark={benchmark}"]
    if workers is not None:
        extra.append(f"ray.workers={workers}")
    if limit is not None:
        extra.append(f"limit={limit}")
    if address is not None:
        extra.append(f"ray.address={address}")
    preset = preset or ("demo" if benchmark == "demo" else "headline")
    cfg = _cfg(preset, sets, config_file, extra)
    _run(lambda: run_benchmark.main(cfg, run_dir=run_dir, resume=resume, evaluate=evaluate))


@app.command("encode-corpus")
def encode_corpus(
    benchmark: str = typer.Option("coco", help="whose training-caption corpus to encode"),
    encoder: Optional[str] = typer.Option(None, help="open_clip model name (default: retrieval.encoder.model)"),
    pretrained: Optional[str] = typer.Option(None, help="open_clip tag or local checkpoint file"),
    workers: int = typer.Option(None, "--workers", "-w"),
    preset: str = PRESET,
    sets: Optional[List[str]] = SET,
    config_file: Optional[Path] = CONFIG_FILE,
    address: Optional[str] = typer.Option(None),
):
    """Encode a caption corpus into a content-addressed index (resumable, sharded over workers)."""
    from jobs import encode_corpus as job

    extra = [f"benchmark={benchmark}"]
    if encoder:
        extra.append(f"retrieval.encoder.model={encoder}")
    if pretrained:
        extra.append(f"retrieval.encoder.pretrained={pretrained}")
    if workers is not None:
        extra.append(f"ray.workers={workers}")
    if address is not None:
        extra.append(f"ray.address={address}")
    cfg = _cfg(preset, sets, config_file, extra)
    _run(lambda: job.main(cfg))


@app.command("fit")
def fit(
    run: Path = typer.Option(..., "--run", help="run directory with features/"),
    sets: Optional[List[str]] = SET,
):
    """Fit the rerankers per protocol on a run's feature tables and write predictions."""
    from jobs import fit as job

    cfg = _cfg("headline", sets, run / "config.toml")
    _run(lambda: job.main(cfg, run))


@app.command("evaluate")
def evaluate(
    run: Optional[Path] = typer.Option(None, "--run", help="score every predictions/<protocol>/*.json of a run"),
    predictions: Optional[Path] = typer.Option(None, help="a COCO results JSON [{image_id, caption}]"),
    references: Optional[Path] = typer.Option(None, help="COCO captions, Karpathy dataset_*.json, NoCaps, IFCap"),
    fmt: str = typer.Option("auto", "--format", help="auto | coco | karpathy | nocaps | ifcap"),
    split: Optional[str] = typer.Option(None, help="split of a Karpathy file (test, val)"),
    out: Optional[Path] = typer.Option(None, help="write the metrics JSON here"),
    spice_jars: Optional[Path] = typer.Option(None, help="directory with Stanford CoreNLP 3.6.0 jars for SPICE"),
    no_spice: bool = typer.Option(False, "--no-spice", help="skip SPICE"),
    intersection: bool = typer.Option(False, "--intersection",
                                      help="score only images present in both predictions and references"),
):
    """Score predictions: BLEU, METEOR, ROUGE-L, CIDEr, SPICE, CHAIR proxy (and NoCaps domains)."""
    from jobs import evaluate as job

    _run(lambda: job.main(run=run, predictions=predictions, references=references, fmt=fmt, split=split,
                          out=out, spice_jars=spice_jars, spice=not no_spice, intersection=intersection))


@app.command("report")
def report(
    run: List[Path] = typer.Option(..., "--run", help="run directory (repeat to compare runs side by side)"),
    out: Optional[Path] = typer.Option(None, help="output directory (default: the first run)"),
):
    """Write report.md, LaTeX tables, plots and the qualitative HTML gallery."""
    from jobs import evaluate as job

    _run(lambda: job.report(run, out))


@app.command("demo")
def demo(
    run_dir: Path = typer.Option(Path("runs/demo"), "--run-dir"),
    workers: int = typer.Option(1, "--workers", "-w"),
    sets: Optional[List[str]] = SET,
):
    """The whole job on the built-in demo world with tiny models on a local Ray."""
    from jobs import demo as job

    cfg = _cfg("demo", sets, None, [f"ray.workers={workers}"])
    _run(lambda: job.main(cfg, run_dir))


@app.command("lavis-env")
def lavis_env_cmd(
    preset: str = PRESET,
    sets: Optional[List[str]] = SET,
    force: bool = typer.Option(False, "--force", help="rebuild even when it is built"),
):
    """Build the isolated salesforce-lavis environment of verifier.backend=lavis (under {cache}/envs)."""
    from adjcap import lavis_env

    cfg = _cfg(preset, sets, None)
    _run(lambda: typer.echo(lavis_env.build(cfg.cache_dir, force=force)))


@app.command("doctor")
def doctor(preset: str = PRESET, sets: Optional[List[str]] = SET):
    """Report Python, torch, CUDA/ROCm, Ray, Java, SPICE jars and which weights are found."""
    from adjcap.doctor import report as doctor_report

    typer.echo(doctor_report(_cfg(preset, sets, None)))


def _run(fn):
    try:
        return fn()
    except (ConfigError, FileNotFoundError, ValueError) as e:
        typer.secho(f"error: {e}", fg="red", err=True)
        raise typer.Exit(2) from None


def main() -> None:
    app()


if __name__ == "__main__":
    sys.exit(main())

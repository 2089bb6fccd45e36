"""adjcap command line. Parses arguments, resolves the config, calls a job. No logic of its own."""

from __future__ import annotations

import errno
import signal
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, List, Optional

import typer

from adjcap.machine import numerics
from adjcap.config import Config, ConfigError, config_data, list_presets, validate_config
from adjcap.jobs.failures import ImagesFailed
from adjcap.storage.rundir import RunDir

app = typer.Typer(
    help="Adjudicated Captioning: Ray-distributed batch evaluation of zero-shot image captioning.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
STATE = {"debug": False}

PRESET = typer.Option("headline", "--preset", "-p", help="config preset (adjcap config --list)")
SET = typer.Option(None, "--set", "-s", help="override a config key: --set verifier.model=ID (repeatable)")
CONFIG_FILE = typer.Option(None, "--config", help="a saved config.toml (e.g. runs/x/config.toml) instead of a preset")
WORKERS = typer.Option(None, "--workers", "-w", help="actors per pool (default: config ray.workers)")
ADDRESS = typer.Option(None, help="existing Ray cluster (ray://... or auto); default: a local Ray")
VERBOSE = typer.Option(False, "--verbose", help="Ray's own console output as well: Ray Data's operator progress, "
                       "Ray's INFO lines, the workers' output (default: adjcap's progress and summary only)")
LOG = typer.Option(None, "--log", help="log the finished run to an experiment tracker: mlflow[=TRACKING_URI] or "
                   "wandb[=PROJECT] (repeatable; needs the package: pip install 'adjcap\\[mlflow]' or 'adjcap\\[wandb]')")


def _version(value: bool) -> None:
    if value:
        from adjcap.storage.provenance import version_text

        typer.echo(version_text())
        raise typer.Exit()


@app.callback()
def main_options(debug: bool = typer.Option(False, "--debug", help="show tracebacks instead of one-line errors"),
                 version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                              help="print adjcap's version and the key libraries' and exit")):
    STATE["debug"] = debug


def _typed(**updates: Any) -> dict[str, Any]:
    """Command-line options as typed config updates; an option the user did not give changes nothing."""
    return {k: v for k, v in updates.items() if v is not None}


def _cfg(preset: str | None, sets: Optional[List[str]], config_file: Optional[Path],
         updates: dict[str, Any] | None = None, computes: bool = True) -> Config:
    """The command's config, resolved once here. A command that ``computes`` with portable numerics
    starts again with them when run as the ``adjcap`` program (adjcap.machine.numerics.enter), before the
    config is validated; commands import their jobs after this call, so torch is imported once."""
    try:
        data = config_data(None if config_file else preset, list(sets or []), config_file, updates=updates)
        if computes:  # before validation, which imports the registries and torch with them
            numerics.enter(data.get("numerics"), restart=STATE.get("program", False))
        return validate_config(data)
    except ConfigError as e:
        typer.secho(f"error: {e}", fg="red", err=True)
        raise typer.Exit(2) from None


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _stop_code(e: KeyboardInterrupt) -> int:
    """The shell's code for a stop by signal: 128 + SIGTERM's number (143) or SIGINT's (130, Ctrl-C)."""
    return 128 + (signal.SIGTERM if e.args == ("SIGTERM",) else signal.SIGINT)


def _no_space(e: BaseException) -> str | None:
    """A full disk (or a file-size limit) as one line naming where, and what to do."""
    full = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
    texts = ("No space left on device", "File too large", "Disk quota exceeded")
    while e is not None and not (isinstance(e, OSError) and (e.errno in full or any(t in str(e) for t in texts))):
        e = e.__cause__ or e.__context__
    if e is None:
        return None
    where = Path(e.filename).parent if e.filename else None
    why = e.strerror or next(t for t in texts if t in str(e))
    return (f"no space left writing to {where or 'the output directory'} ({why}); nothing half-written was "
            "kept: free some space there or write elsewhere (--run-dir / --out), then rerun")


def _gpu_failure(e: BaseException) -> str | None:
    """A GPU failure in a pool (out of memory at one image, a CUDA error), however Ray wrapped it, as
    its one line (adjcap.engine.gpu_errors)."""
    if "torch" not in sys.modules:  # nothing ran on a GPU
        return None
    from adjcap.engine import gpu_errors

    found = gpu_errors.find(e)
    return None if found is None else str(found)


def _run(fn: Callable[[], Any]) -> Any:
    """Run a job; any failure is one line naming what to do (``--debug``: the traceback). SIGTERM
    stops it like Ctrl-C: the run lock and Ray are released, completed parts are kept."""
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        return fn()
    except (typer.Exit, typer.Abort):
        raise
    except ImagesFailed as e:  # everything is written (or, stopped early, kept); the line says how many and why
        typer.secho(str(e), fg="red", err=True)
        raise typer.Exit(e.exit_code) from None
    except KeyboardInterrupt as e:
        typer.secho("interrupted: completed feature parts are kept; rerun the same command to resume", err=True)
        raise typer.Exit(_stop_code(e)) from None
    except Exception as e:  # noqa: BLE001 - the one place user-facing failures are turned into lines
        if STATE["debug"]:
            traceback.print_exc()
        msg = _no_space(e) or _gpu_failure(e) or (str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)
        typer.secho(f"error: {msg}" + ("" if STATE["debug"] else "  (--debug for the traceback)"), fg="red", err=True)
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
    typer.echo(_cfg(preset, sets, config_file, computes=False).to_toml())


@app.command("run-job")
def run_job(
    benchmark: str = typer.Argument(..., help="coco | flickr30k | nocaps | demo | a configured benchmark name"),
    workers: Optional[int] = WORKERS,
    preset: Optional[str] = typer.Option(None, "--preset", "-p",
                                         help="config preset (default: headline; demo for the demo benchmark)"),
    sets: Optional[List[str]] = SET,
    config_file: Optional[Path] = CONFIG_FILE,
    limit: Optional[int] = typer.Option(None, help="only the first N images of each split"),
    address: Optional[str] = ADDRESS,
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="output directory (default runs/<preset>-<benchmark>)"),
    resume: bool = typer.Option(True, "--resume/--fresh", help="skip images already written / start over"),
    evaluate: bool = typer.Option(True, "--evaluate/--no-evaluate", help="fit, predict and evaluate after the features"),
    log: Optional[List[str]] = LOG,
    verbose: bool = VERBOSE,
):
    """Stream a benchmark through the four actor pools, write features, fit, predict, evaluate."""
    cfg = _cfg(preset or ("demo" if benchmark == "demo" else "headline"), sets, config_file,
               _typed(**{"benchmark": benchmark, "ray.workers": workers, "limit": limit, "ray.address": address,
                         "ray.verbose": verbose or None}))
    from adjcap.jobs import demo, run

    job = demo.main if benchmark == "demo" else run.main
    _run(lambda: job(cfg, run_dir=run_dir, resume=resume, evaluate_after=evaluate, log=list(log or []), strict=True))


@app.command("caption")
def caption(
    folder: Path = typer.Argument(..., help="a folder of images (searched recursively; EXIF orientation honoured)"),
    preset: str = PRESET,
    heads: Optional[Path] = typer.Option(None, "--heads", help="RUN_DIR/heads fitted by an earlier run "
                                         "(default: the training-free picker)"),
    out: Optional[Path] = typer.Option(None, "--out", help="captions.jsonl to write (default: in the run "
                                       "directory); captions.html goes beside it"),
    workers: Optional[int] = WORKERS,
    sets: Optional[List[str]] = SET,
    config_file: Optional[Path] = CONFIG_FILE,
    address: Optional[str] = ADDRESS,
    run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="output directory (default runs/caption-<folder>-<hash>)"),
    absolute_paths: bool = typer.Option(False, "--absolute-paths", help="absolute image paths in captions.jsonl "
                                        "(default: relative to FOLDER, so a moved folder keeps working)"),
    candidates: Optional[Path] = typer.Option(None, "--candidates", help="adjudicate your own captions instead of "
                                              "IFCap's: a JSONL/Parquet file, one {image, candidates, logprobs} per "
                                              "image (captioner.family=candidates)"),
    resume: bool = typer.Option(True, "--resume/--fresh", help="skip images already captioned in the run "
                                "directory / start over (needed after a change of settings or candidates file)"),
    verbose: bool = VERBOSE,
):
    """Caption a folder of your own images: the same Ray job, one caption per image with its candidates.
    Checks the preset's weights and memory first and says what is missing (adjcap prepare --for PRESET)."""
    own = {"captioner.family": "candidates", "captioner.candidates.file": str(candidates.expanduser().resolve())} \
        if candidates is not None else {}
    cfg = _cfg(preset, sets, config_file, _typed(**{"ray.workers": workers, "ray.address": address,
                                                    "ray.verbose": verbose or None, **own}))
    from adjcap.jobs import caption as job

    _run(lambda: job.main(cfg, folder, heads=heads, out=out, run_dir=run_dir, resume=resume,
                          absolute_paths=absolute_paths, strict=True))


@app.command("reproduce")
def reproduce(
    table: Optional[str] = typer.Argument(None, help="reproduction | scoreboard | protocols | ablation | captioner-sweep | "
                                          "verifier-substrate | xdomain | chair | clipscore | corpus-swap | lvlm-chair | ..."),
    benchmark: Optional[str] = typer.Option(None, help="run every row on this benchmark (demo: the demo world, "
                                            "tiny models, CPU); default: the paper's"),
    workers: Optional[int] = WORKERS,
    sets: Optional[List[str]] = SET,
    limit: Optional[int] = typer.Option(None, help="only the first N images of each split"),
    runs_dir: Optional[Path] = typer.Option(None, "--runs-dir", help="where the rows' run directories go "
                                            "(default: paths.runs_dir)"),
    address: Optional[str] = ADDRESS,
    list_: bool = typer.Option(False, "--list", help="list the tables, their rows and presets, and exit"),
    seeds: Optional[str] = typer.Option(None, "--seeds", help="the seed study on every row that fits heads: "
                                        "rerank.seeds, comma-separated (e.g. 42,43,44)"),
    captioner: Optional[str] = typer.Option(None, "--captioner", help="lvlm-chair: the vision-language checkpoint "
                                            "(captioner.vlm.model: a hub id or directory)"),
):
    """Run every row of one of the paper's tables and render it beside the published values."""
    from adjcap.reproduce import listing_with_status
    from adjcap.jobs import reproduce as job

    if list_ or table is None:
        typer.echo(listing_with_status())
        return
    try:
        seed_list = [int(x) for x in seeds.split(",") if x.strip()] if seeds is not None else None
    except ValueError:
        typer.secho(f"error: --seeds {seeds!r}: give integers separated by commas, e.g. 42,43,44", fg="red", err=True)
        raise typer.Exit(2) from None
    updates = _typed(**{"ray.workers": workers, "limit": limit, "ray.address": address, "rerank.seeds": seed_list,
                        "captioner.vlm.model": captioner})
    try:
        from adjcap.reproduce import get_table, plan_table

        plan_table(get_table(table), benchmark, list(sets or []), updates, runs_dir)  # config errors first
    except ConfigError as e:
        typer.secho(f"error: {e}", fg="red", err=True)
        raise typer.Exit(2) from None
    _run(lambda: job.main(table, benchmark, list(sets or []), updates, runs_dir))


@app.command("encode-corpus")
def encode_corpus(
    benchmark: str = typer.Option("coco", help="whose training-caption corpus to encode"),
    encoder: Optional[str] = typer.Option(None, help="open_clip model name (default: retrieval.encoder.model)"),
    pretrained: Optional[str] = typer.Option(None, help="open_clip tag or local checkpoint file"),
    workers: Optional[int] = WORKERS,
    preset: str = PRESET,
    sets: Optional[List[str]] = SET,
    config_file: Optional[Path] = CONFIG_FILE,
    address: Optional[str] = ADDRESS,
    verbose: bool = VERBOSE,
):
    """Encode a caption corpus into a content-addressed index (resumable, sharded over workers)."""
    cfg = _cfg(preset, sets, config_file, _typed(**{
        "benchmark": benchmark, "retrieval.encoder.model": encoder, "retrieval.encoder.pretrained": pretrained,
        "ray.workers": workers, "ray.address": address, "ray.verbose": verbose or None}))
    from adjcap.jobs import encode_corpus as job

    _run(lambda: job.main(cfg))


@app.command("fit")
def fit(
    run: Path = typer.Option(..., "--run", help="run directory with features/"),
    sets: Optional[List[str]] = SET,
    heads: Optional[Path] = typer.Option(None, "--heads",
                                         help="apply heads fitted in another run (e.g. runs/A/heads) instead of fitting"),
    log: Optional[List[str]] = LOG,
):
    """Fit the rerankers per protocol on a run's feature tables and write predictions
    (or, with --heads, apply heads fitted on another benchmark)."""
    rd = RunDir(run)
    if not rd.config_path.exists():
        typer.secho(f"error: {rd.config_path} not found: is {run} a run directory?", fg="red", err=True)
        raise typer.Exit(2)
    cfg = _cfg(None, sets, rd.config_path)
    from adjcap.jobs import fit as job

    _run(lambda: job.refit(cfg.resolved(), rd, heads_dir=heads, log=list(log or []), saved=cfg))


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
    sets: Optional[List[str]] = SET,
):
    """Score predictions: BLEU, METEOR, ROUGE-L, CIDEr, SPICE, CHAIR (eval.chair: the proxy, or the original
    with COCO instances: --set eval.chair=both) (and NoCaps domains)."""
    eval_updates = _typed(**{"eval.spice_jars": str(spice_jars) if spice_jars else None})
    eval_updates["eval.spice"] = not no_spice
    if run is None and (predictions is None or references is None):
        typer.secho("error: give --run DIR, or --predictions PRED.json with --references REFS", fg="red", err=True)
        raise typer.Exit(2)
    rd = RunDir(run) if run is not None else None
    # the run's own config, else the headline preset's eval settings
    cfg = _cfg(None if rd else "headline", sets, rd.config_path if rd else None, eval_updates,
               computes=rd is not None).resolved()
    from adjcap.jobs import evaluate as job

    if rd is not None:
        _run(lambda: job.evaluate_saved_run(cfg, rd, intersection=intersection))
        return
    _run(lambda: job.evaluate_file(cfg.eval, predictions, references, fmt, split, out, intersection=intersection))


@app.command("report")
def report(
    run: List[Path] = typer.Option(..., "--run", help="run directory (repeat to compare runs side by side)"),
    out: Optional[Path] = typer.Option(None, help="output directory (default: the first run)"),
    baseline: Optional[Path] = typer.Option(
        None, "--baseline", help="the run the CHAIR and cross-domain IFCap columns compare against (e.g. the ifcap "
        "run); default: each run's own LM-only pick"),
):
    """Write report.md, LaTeX tables, plots and the qualitative HTML gallery."""
    from adjcap.jobs import evaluate as job

    _run(lambda: job.report(run, out, baseline))


@app.command("compare")
def compare(
    runs: List[Path] = typer.Argument(..., help="run directories: RUN_A RUN_B [...]; each later run is compared "
                                      "against the first"),
    out: Path = typer.Option(Path("."), "--out", help="where compare.md and compare.html go (default: the current "
                             "directory)"),
    intersection: bool = typer.Option(False, "--intersection", help="compare on the images both runs share "
                                      "instead of refusing runs with different image sets"),
):
    """B - A for every metric and picker of both runs, with paired bootstrap 95% intervals."""
    from adjcap.jobs import evaluate as job

    _run(lambda: job.compare(runs, out, intersection))


@app.command("demo")
def demo(
    run_dir: Path = typer.Option(Path("runs/demo"), "--run-dir"),
    workers: int = typer.Option(1, "--workers", "-w"),
    sets: Optional[List[str]] = SET,
    resume: bool = typer.Option(True, "--resume/--fresh", help="skip images already written / start over"),
    log: Optional[List[str]] = LOG,
    verbose: bool = VERBOSE,
):
    """The whole job on the built-in demo world with tiny models on a local Ray."""
    cfg = _cfg("demo", sets, None, _typed(**{"ray.workers": workers, "ray.verbose": verbose or None}))
    from adjcap.jobs import demo as job

    _run(lambda: job.main(cfg, run_dir, resume=resume, log=list(log or [])))


@app.command("lavis-env")
def lavis_env_cmd(
    preset: str = PRESET,
    sets: Optional[List[str]] = SET,
    force: bool = typer.Option(False, "--force", help="rebuild even when it is built"),
):
    """Build the isolated salesforce-lavis environment of verifier.backend=lavis (under {cache}/envs)."""
    from adjcap.models import lavis_env

    cfg = _cfg(preset, sets, None)
    _run(lambda: typer.echo(lavis_env.build(cfg.cache_dir, force=force)))


@app.command("doctor")
def doctor(preset: str = PRESET, sets: Optional[List[str]] = SET):
    """Check everything the preset needs here (weights, data, NLTK data, Java, SPICE jars when it scores
    SPICE, the memory plan); exit 1 when something is missing."""
    from adjcap.machine.doctor import diagnose
    from adjcap.jobs.preflight import memory_problem

    cfg = _cfg(preset, sets, None, computes=False).resolved()
    text, problems = diagnose(cfg, memory_problem(cfg))
    typer.echo(text)
    if problems:
        raise typer.Exit(1)


@app.command("prepare")
def prepare(
    what: Optional[List[str]] = typer.Argument(None, help="coco | flickr30k | nocaps | ifcap | models | nltk | spice | "
                                               "coco-instances | corpus-cc3m | corpus-laion-coco | all"),
    data: Optional[Path] = typer.Option(None, "--data", help="data root (default: $ADJCAP_DATA or ~/adjcap-data)"),
    from_dir: Optional[Path] = typer.Option(None, "--from", help="lay out from local copies in DIR instead of downloading"),
    dry_run: bool = typer.Option(False, "--dry-run", help="list what would be fetched, from where, and the total size"),
    verify: bool = typer.Option(False, "--verify", help="re-check laid-out files against {data}/prepare.lock.json"),
    workers: int = typer.Option(8, "--workers", "-w", help="parallel downloads"),
    preset: str = typer.Option("headline", "--preset", "-p", help="whose models the models step fetches"),
    sets: Optional[List[str]] = SET,
    coco_zip: bool = typer.Option(False, "--coco-zip", help="fetch the whole val2014 zip (6.6 GB) instead of the 10,000 Karpathy images"),
    mirror: Optional[str] = typer.Option(None, "--mirror", help="fetch every URL as MIRROR/<host>/<path> (an HTTP mirror)"),
    sources: Optional[Path] = typer.Option(None, "--sources", help="a TOML file laid over adjcap/prepare/sources.toml"),
    for_: Optional[List[str]] = typer.Option(None, "--for", help="exactly what a preset or a reproduce table needs "
                                             "(adjcap config --list, adjcap reproduce --list; repeatable)"),
    max_captions: Optional[int] = typer.Option(None, "--max-captions", min=1, help="corpus-cc3m, corpus-laion-coco: "
                                               "keep N captions, sampled with a fixed seed (recorded in the manifest)"),
):
    """Fetch, verify and lay out benchmarks, the IFCap release, model weights, NLTK data and SPICE jars."""
    from adjcap.prepare import Options, PrepareError, run

    if data is None:
        data = Path(_cfg(preset, sets, None, computes=False).resolved().paths.data_dir)
    opts = Options(data=data, from_dir=from_dir, dry_run=dry_run, workers=workers, preset=preset,
                   coco_zip=coco_zip, mirror=mirror, sources=sources, sets=list(sets or []), targets=list(for_ or []),
                   max_captions=max_captions)
    try:
        run(what or [], opts, verify=verify)
    except (PrepareError, OSError) as e:
        if STATE["debug"]:
            raise
        typer.secho(f"error: {e}", fg="red", err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        typer.secho("interrupted; run the same command again to resume", fg="red", err=True)
        raise typer.Exit(130) from None


def main() -> None:
    STATE["program"] = True  # the adjcap program itself (not a test's or a notebook's in-process call)
    app()


if __name__ == "__main__":
    sys.exit(main())

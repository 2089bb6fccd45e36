"""``adjcap caption DIR``: caption a folder of one's own images with the main job.

The folder becomes a benchmark without references (format ``folder``, EXIF orientation honoured, the
preset's own caption corpus for retrieval); the same Ray job as ``run-job`` writes its features; then
the training-free picker (default) or heads fitted in an earlier run (``--heads RUN_DIR/heads``)
choose one caption per image. Written: ``captions.jsonl`` (image path, chosen caption, every candidate
with its three scores) and ``captions.html`` beside it, plus the run directory's usual
features/ and predictions/."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

from adjcap.config import Config
from adjcap.data.layouts.folder import scan_folder
from adjcap.rerank import get_picker, load_heads, picker_names, run_protocol
from adjcap.report.captions import caption_records, write_gallery, write_jsonl
from adjcap.storage.rundir import RunDir
from adjcap.jobs import demo, failures, run

FOLDER_BENCHMARK = "folder"
LM_PICKER = "lm"
DEFAULT_TRAINING_FREE = "fixed"
DEMO_BENCHMARK = "demo"  # the demo preset's benchmark: the synthetic world its tiny models know


def folder_config(cfg: Config, folder: Path, with_heads: bool) -> Config:
    """``cfg`` with the folder as benchmark ``folder`` (split ``test``) and a protocol that fits
    nothing: training-free (the configured picker when it needs no heads, else the fixed fusion), or,
    with heads, the configured (learned) picker applied with them."""
    data = cfg.model_dump(mode="json")
    source = cfg.benchmark_cfg(cfg.benchmark)
    data["benchmarks"][FOLDER_BENCHMARK] = {
        "format": "folder", "annotations": str(folder), "images": str(folder),
        "corpus": source.corpus, "corpus_format": source.corpus_format, "exif_transpose": None,
    }
    data["benchmark"] = FOLDER_BENCHMARK
    data["splits"] = ["test"]
    r = data["rerank"]
    r.update(apply_split="test", select=False)
    if not with_heads:
        r["protocol"] = "training-free"
        if get_picker(r["picker"]).learned:
            r["picker"] = DEFAULT_TRAINING_FREE
    elif not get_picker(r["picker"]).learned:
        raise ValueError(f"--heads given but rerank.picker = {r['picker']!r} uses no heads; pick one of "
                         f"{', '.join(picker_names(learned=True))} (--set rerank.picker=...)")
    return Config.model_validate(data)


def demo_world_mismatch(cfg: Config, folder: Path, benchmark: str | None = None) -> str | None:
    """A one-line warning when the demo preset (tiny models trained on the synthetic demo world) meets
    images that are not the demo world's: every image must be a file of the world's manifest
    (``images/<name>`` at the same byte size). None when they all are, or the config is not on the demo
    world. ``cfg`` resolved; ``benchmark``: the benchmark it was given for (default: its own)."""
    if (benchmark or cfg.benchmark) != DEMO_BENCHMARK:
        return None
    manifest = Path(cfg.benchmark_cfg(DEMO_BENCHMARK).images).parent / "manifest.json"
    try:
        files = json.loads(manifest.read_text()).get("files", {})
    except (OSError, ValueError):
        files = {}
    try:
        names = [e.image_id for e in scan_folder(folder)]
    except Exception:  # noqa: BLE001 - the job itself reports an unusable folder
        return None
    foreign = [n for n in names if files.get(f"images/{n}") != (folder / n).stat().st_size]
    if not foreign:
        return None
    return (f"warning: --preset demo captions with tiny models trained only on the synthetic demo world; "
            f"{len(foreign)} of {len(names)} images in {folder} are not demo-world images (e.g. {foreign[0]}), "
            f"so their captions describe coloured shapes, not your photos: use a real preset "
            f"(adjcap doctor --preset headline / cpu-16gb)")


def default_run_dir(cfg: Config, folder: Path) -> RunDir:
    """``<runs_dir>/caption-<folder name>-<hash of its absolute path>`` (``cfg`` resolved): two folders
    never share one."""
    tag = hashlib.sha256(str(folder).encode()).hexdigest()[:8]
    return RunDir(Path(cfg.paths.runs_dir) / f"caption-{folder.name or 'root'}-{tag}")


def main(cfg: Config, folder: str | Path, heads: str | Path | None = None, out: str | Path | None = None,
         run_dir: str | Path | None = None, resume: bool = True, absolute_paths: bool = False,
         strict: bool = False) -> Path:
    """Caption every image under ``folder``; returns the captions.jsonl path. Refuses (PreflightError,
    before Ray starts and before anything is written) when the preset's weights, corpus or memory are
    not there. ``absolute_paths``: image paths in captions.jsonl absolute instead of relative to
    ``folder``. ``strict``: failed images end it with :class:`adjcap.jobs.failures.ImagesFailed` once
    everything is written (the command line's exit code)."""
    started = time.time_ns()
    folder = Path(folder).expanduser().resolve()
    if not folder.is_dir():
        raise NotADirectoryError(f"{folder}: not a directory; give a folder of images")
    cfg = demo.prepare_if_demo(cfg)
    fcfg = folder_config(cfg, folder, heads is not None)
    rcfg = fcfg.resolved()  # the edge of this job: resolved once, its run plan built from it
    plan = run.plan_run(fcfg, rcfg, run_dir or default_run_dir(rcfg, folder), evaluates=False)
    warning = demo_world_mismatch(rcfg, folder, benchmark=cfg.benchmark)
    if warning:
        print(warning)
    fitted = load_heads(Path(heads).expanduser(), rcfg) if heads is not None else None
    rd = plan.run
    run.execute(plan, resume=resume, evaluate_after=False, summary=False)

    table = rd.read_features(FOLDER_BENCHMARK, "test", image_ids=rd.current_ids(FOLDER_BENCHMARK, "test"))
    result = run_protocol(rcfg, {"test": table}, heads=fitted)
    lm_cfg = rcfg.model_copy(update={"rerank": rcfg.rerank.model_copy(update={"picker": LM_PICKER,
                                                                             "protocol": "training-free"})})
    lm = run_protocol(lm_cfg, {"test": table})
    picker, proto = rcfg.rerank.picker, rcfg.rerank.protocol
    chosen = {iid: p.index for iid, p in result.picks["test"].items()}
    lm_chosen = {iid: p.index for iid, p in lm.picks["test"].items()}
    for name, picks in ((picker, result.picks["test"]), (LM_PICKER, lm.picks["test"])):
        rd.write_predictions(proto, name, [{"image_id": i, "caption": p.caption, "candidate_index": p.index}
                                           for i, p in sorted(picks.items())])
    dest = Path(out).expanduser() if out else rd.captions_jsonl
    records = caption_records(table.to_pylist(), chosen, lm_chosen, folder, picker, absolute=absolute_paths)
    write_jsonl(dest, records)
    gallery = write_gallery(dest.with_suffix(".html"), records, image_root=folder,
                            title=f"adjcap captions: {folder.name} ({picker}" + (", fitted heads)" if fitted else ")"))
    failed = sum(1 for r in records if r["error"])
    print(f"captions: {len(records) - failed} images captioned by '{picker}'"
          + (f", {failed} failed (their lines say why)" if failed else ""))
    print(f"gallery: {gallery}")
    run.print_written(rd, started)
    print(dest)
    failures.report(rd, FOLDER_BENCHMARK, plan.records, strict)
    return dest

"""`adjcap prepare`: fetch, verify and lay out the benchmarks, the IFCap release, model weights, NLTK
data and the SPICE jars exactly where the presets look (``{data}/...``).

Support code, not the method: standard library networking (urllib), zip/tar extraction and hashing.
Sources live in ``sources.toml``; every laid-out file's sha256 goes into ``{data}/prepare.lock.json``.
One run per data folder holds ``{data}/.prepare-run.lock`` and first deals with what killed runs left."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, Iterable, TextIO

from adjcap.prepare.download import Downloader
from adjcap.prepare.errors import PrepareError
from adjcap.prepare.leftovers import sweep
from adjcap.prepare.limits import limits_of
from adjcap.prepare.lock import LOCK_NAME, Lock
from adjcap.prepare.download_progress import human_bytes
from adjcap.prepare.runlock import RUN_LOCK_NAME, holding
from adjcap.prepare.sources import load_sources
from adjcap.prepare.steps import ALL, STEPS, Context, Options, Planned
from adjcap.prepare.targets import configs_for, configs_for_all, steps_of_configs
from adjcap.registry import unknown

__all__ = ["ALL", "STEPS", "Options", "PrepareError", "run", "steps_of"]


def steps_of(what: Iterable[str]) -> list[str]:
    """Step names in run order; ``all`` expands; unknown names are a PrepareError."""
    names: set[str] = set()
    for w in what:
        w = w.strip().lower()
        if w == "all":
            names.update(ALL)
        elif w in STEPS:
            names.add(w)
        else:
            raise PrepareError(unknown("thing to prepare", w, [*STEPS, "all"]))
    return [n for n in STEPS if n in names]


def _context(opts: Options, say: Callable[[str], None], stream: TextIO | None, open_file=None) -> Context:
    sources = load_sources(opts.sources)
    deadlines, extract_limits = limits_of(sources)
    kw = {"open_file": open_file} if open_file is not None else {}
    dl = Downloader(workers=opts.workers, host_limits=sources.get("hosts", {}), retries=opts.retries,
                    backoff=opts.backoff, timeout=opts.timeout, stream=stream, deadlines=deadlines, **kw)
    return Context(opts=opts, sources=sources, lock=Lock(opts.data), downloader=dl, say=say,
                   extract_limits=extract_limits)


def _dry_run(ctx: Context, names: list[str]) -> int:
    rows: list[Planned] = []
    for n in names:
        rows += STEPS[n].plan(ctx)
    total = sum(r.size or 0 for r in rows)
    unknown = [r for r in rows if r.size is None and r.note != "skipped"]
    estimate = any(not r.exact and r.size for r in rows)
    for r in rows:
        size = "-" if r.size == 0 else human_bytes(r.size) if r.size is not None else "size unknown"
        approx = "~" if (r.size and not r.exact) else ""
        ctx.say(f"{r.what:52s} {approx}{size:>12s}  {r.source} -> {r.dest}")
    tail = f" (+{len(unknown)} of unknown size)" if unknown else ""
    ctx.say(f"total to fetch: {'about ' if estimate else ''}{human_bytes(total)}{tail}; nothing was written (--dry-run)")
    return 0


def _verify(ctx: Context, names: list[str] | None) -> int:
    if not ctx.lock.path.exists():
        raise PrepareError(f"{ctx.lock.path}: no lock file; run `adjcap prepare ...` first (it writes one)")
    if names is None:  # everything the lock knows about
        names = [n for n in STEPS if ctx.lock.files_of([n]) or (n == "models" and ctx.lock.doc["models"])]
    problems = ctx.lock.verify(names)
    for n in names:
        problems += [f"{n}: {p}" for p in STEPS[n].check(ctx)]
    for p in problems:
        ctx.say(f"verify: {p}")
    if problems:
        raise PrepareError(
            f"{len(problems)} problem(s) in {ctx.data} against {LOCK_NAME} (first: {problems[0]}); "
            "run `adjcap prepare` for the steps named to fetch them again"
        )
    ctx.say(f"verify: {len(ctx.lock.files_of(names))} files match {ctx.lock.path}; "
            f"{', '.join(names) or 'no step'} complete")
    return 0


def _flickr_where(opts: Options) -> str:
    return load_sources(opts.sources)["flickr30k"]["where"]


def _tidy(work: Path) -> None:
    """Remove the empty folders of the work area (downloads/staging of finished steps)."""
    if not work.is_dir():
        return
    for d in sorted((p for p in work.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        if not any(d.iterdir()):
            d.rmdir()
    if not any(work.iterdir()):
        work.rmdir()


def run(what: Iterable[str], opts: Options, *, verify: bool = False, say: Callable[[str], None] | None = None,
        stream: TextIO | None = None, open_file=None) -> int:
    """Run the steps named in ``what`` (or, with ``verify``, check them; no names: everything the lock
    knows). Returns 0; failures raise PrepareError (one line)."""
    say = say or (lambda s: print(s, flush=True))
    what = list(what)
    if not what and not verify and not opts.targets:
        raise PrepareError(f"name what to prepare: {', '.join([*STEPS, 'all'])} or --for PRESET|TABLE "
                           "(e.g. `adjcap prepare --for headline`)")
    opts.data = Path(opts.data).expanduser()
    names = steps_of(what) if what else None
    if names is not None and opts.from_dir is not None and "all" in [w.lower() for w in what]:
        names = steps_of([*names, "flickr30k"])
    if opts.targets:  # exactly what these presets / tables need
        for t in opts.targets:
            opts.configs += configs_for(t, opts.data, opts.sets)
        names = steps_of([*(names or []), *steps_of_configs(opts.configs, STEPS)])
        if opts.from_dir is None and not opts.dry_run and "flickr30k" in names:
            names.remove("flickr30k")
            say(f"flickr30k: skipped ({_flickr_where(opts)}; then `adjcap prepare flickr30k --from DIR`)")
    elif names is not None and "all" in [w.lower() for w in what]:  # every table's models, not one preset's
        opts.configs = configs_for_all(opts.data, opts.preset, opts.sets)
    if opts.from_dir is not None:
        opts.from_dir = Path(opts.from_dir).expanduser()
        if not opts.from_dir.is_dir():
            raise PrepareError(f"{opts.from_dir}: --from directory not found")
    ctx = _context(opts, say, stream if stream is not None else sys.stderr, open_file)
    if verify:
        return _verify(ctx, names)
    assert names is not None
    if opts.dry_run:
        return _dry_run(ctx, names)
    opts.data.mkdir(parents=True, exist_ok=True)
    work = opts.data / ".prepare"
    with holding(opts.data / RUN_LOCK_NAME, str(opts.data)):  # one run per data folder; its leftovers are ours
        ctx.lock = Lock(opts.data)  # read again now that no other run can be writing it
        for line in sweep(opts.data, work).lines(opts.data):
            say(f"prepare: {line}")
        for n in names:
            say(f"{n}: {STEPS[n].summary}")
            try:
                summary = STEPS[n].run(ctx)
            finally:
                ctx.lock.save()  # what finished before a failure stays recorded
            say(f"{n}: done - {summary}")
        if "all" in [w.lower() for w in what] and "flickr30k" not in names:
            say(f"flickr30k: skipped ({ctx.sources['flickr30k']['where']}; then `adjcap prepare flickr30k --from DIR`)")
        _tidy(work)
    say(f"lock: {ctx.lock.path}; `adjcap doctor` shows what the presets find")
    return 0

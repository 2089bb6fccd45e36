"""adjcap's own progress on the driver: per stage, items done / total, rate and ETA, read from the
job's :class:`actors.progress.ProgressBoard` while a phase runs. A terminal gets a live bar (rich);
a file or a pipe gets one line every ``ray.progress_interval`` seconds. The driver also sets the
``adjcap_images_remaining`` / ``adjcap_eta_seconds`` gauges (tag ``phase``)."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import ray

from adjcap.actors import metrics
from adjcap.actors.progress import ProgressBoard, start_board
from adjcap.config import RayCfg

POLL_S = 0.5  # how often a terminal's bar is refreshed from the board


@dataclass
class Tally:
    """A phase's counts at one moment, and what follows from them."""

    stages: Sequence[str]
    total: int
    done: dict[str, int] = field(default_factory=dict)
    failed: dict[str, int] = field(default_factory=dict)
    elapsed: float = 0.0
    first_done_at: float | None = None  # elapsed seconds when the last stage first reported
    first_done: int = 0

    @property
    def finished(self) -> int:
        return self.done.get(self.stages[-1], 0)

    @property
    def remaining(self) -> int:
        return max(self.total - self.finished, 0)

    def rate(self) -> float | None:
        """Items per second through the last stage, since its first batch (model loading excluded);
        when everything came through at once, over the whole elapsed time."""
        if self.first_done_at is None:
            return None
        if self.finished <= self.first_done:
            return self.finished / self.elapsed if self.finished >= self.total and self.elapsed > 0 else None
        dt = self.elapsed - self.first_done_at
        return (self.finished - self.first_done) / dt if dt > 0 else None

    def eta(self) -> float | None:
        if not self.remaining:
            return 0.0
        r = self.rate()
        return self.remaining / r if r else None

    def line(self, name: str, unit: str) -> str:
        parts = []
        for s in self.stages:
            f = self.failed.get(s, 0)
            parts.append(f"{s} {self.done.get(s, 0)}/{self.total}" + (f" ({f} failed)" if f else ""))
        r, eta = self.rate(), self.eta()
        speed = f"{r:.2f} {unit}/s" if r else f"- {unit}/s"
        return f"{name}: " + ", ".join(parts) + f" | {speed} | ETA {duration(eta)} | {duration(self.elapsed)} elapsed"


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


class Lines:
    """A file or a pipe: one line every ``interval`` seconds, and the last one at the end."""

    def __init__(self, out: TextIO, interval: float):
        self.out, self.interval, self.last = out, interval, 0.0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def show(self, t: Tally, name: str, unit: str, final: bool = False) -> None:
        if final or t.elapsed - self.last >= self.interval:
            self.last = t.elapsed
            print(t.line(name, unit), file=self.out, flush=True)


class Bar:
    """A terminal: one live rich bar per stage (done / total, rate, ETA)."""

    def __init__(self, out: TextIO, stages: Sequence[str], total: int, name: str):
        from rich.console import Console
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                   TimeRemainingColumn)

        self.progress = Progress(TextColumn(f"{name} {{task.description:>14}}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[rate]}"), TextColumn("ETA"), TimeRemainingColumn(),
                                 TimeElapsedColumn(), console=Console(file=out), transient=False)
        self.tasks = {s: self.progress.add_task(s, total=total, rate="") for s in stages}

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        return self.progress.__exit__(*exc)

    def show(self, t: Tally, name: str, unit: str, final: bool = False) -> None:
        for s, task in self.tasks.items():
            f = t.failed.get(s, 0)
            rate = t.rate() if s == t.stages[-1] else None
            self.progress.update(task, completed=t.done.get(s, 0),
                                 rate=(f"{rate:.2f} {unit}/s" if rate else "") + (f" {f} failed" if f else ""))
        if final:
            self.progress.refresh()


@contextlib.contextmanager
def tracked(ray_cfg: RayCfg, phase: str, stages: Sequence[str], total: int, unit: str = "images",
            out: TextIO | None = None, local: bool = False) -> Iterator[Any]:
    """Inside a Ray session: yields the phase's progress board (hand it to the stage actors); shows
    the progress until the block ends, then the final counts (always one line or a finished bar).
    ``local``: the stages run in this process (``executor = local``): the board is a plain object
    here, and no Ray metric is set."""
    out = out or sys.stdout
    board = ProgressBoard() if local else start_board()
    tally = Tally(stages, total)
    view = Bar(out, stages, total, phase) if out.isatty() else Lines(out, ray_cfg.progress_interval)
    remaining, eta = (None, None) if local else (metrics.gauge(metrics.REMAINING), metrics.gauge(metrics.ETA))
    tags = {"phase": phase}
    stop = threading.Event()
    t0 = time.monotonic()

    def poll(final: bool = False) -> None:
        snap = board.snapshot() if local else ray.get(board.snapshot.remote())
        tally.done, tally.failed, tally.elapsed = snap["done"], snap["failed"], time.monotonic() - t0
        if tally.first_done_at is None and tally.finished:
            tally.first_done_at, tally.first_done = tally.elapsed, tally.finished
        e = tally.eta()
        if not local:
            remaining.set(tally.remaining, tags=tags)
            if e is not None:
                eta.set(e, tags=tags)
        view.show(tally, phase, unit, final=final)

    def loop() -> None:
        while not stop.wait(POLL_S if isinstance(view, Bar) else min(POLL_S * 4, ray_cfg.progress_interval)):
            try:
                poll()
            except Exception:  # noqa: BLE001 - a failed read is retried on the next tick; the job decides
                pass

    with view:
        thread = threading.Thread(target=loop, name="adjcap-progress", daemon=True)
        thread.start()
        try:
            yield board
        finally:
            stop.set()
            thread.join()
            with contextlib.suppress(Exception):  # the final counts; a failing job keeps its own error
                poll(final=True)
            if not local:
                with contextlib.suppress(Exception):
                    ray.kill(board)

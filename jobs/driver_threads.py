"""Where the driver's CPU goes, by thread (docs/benchmarks/pipeline.md, "The driver off the image path"): a sampler
reads ``/proc/self/task/*/stat`` every 5 s while a phase runs and keeps each thread's last CPU
seconds, so threads that end before the phase does (Ray Data's executor) still count. Python threads
are named by their ``threading`` name, Ray's C++ threads by their kernel name; digits are dropped, so
threads of one kind add up. Linux only (elsewhere: empty)."""

from __future__ import annotations

import os
import re
import threading
from collections import defaultdict

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _tasks() -> dict[int, tuple[str, float]]:
    """tid -> (kernel name, CPU seconds) of every thread of this process now."""
    out = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for t in tids:
        try:
            with open(f"/proc/self/task/{t}/stat") as f:
                head, rest = f.read().rsplit(")", 1)
            fields = rest.split()
            out[int(t)] = (head.split("(", 1)[1], (int(fields[11]) + int(fields[12])) / _TICK)
        except (OSError, ValueError, IndexError):
            continue
    return out


class ThreadCPU(threading.Thread):
    """``with ThreadCPU() as t: ...`` then ``t.by_name()``: CPU seconds per kind of thread in the block."""

    def __init__(self, every: float = 5.0):
        super().__init__(daemon=True, name="adjcap-thread-cpu")
        self.every, self.halt = every, threading.Event()
        self.start_cpu = {tid: cpu for tid, (_, cpu) in _tasks().items()}
        self.seen: dict[int, tuple[str, float]] = {}

    def sample(self) -> None:
        names = {t.native_id: t.name for t in threading.enumerate()}
        for tid, (comm, cpu) in _tasks().items():
            self.seen[tid] = (names.get(tid) or self.seen.get(tid, (comm,))[0], cpu)

    def run(self) -> None:
        while not self.halt.wait(self.every):
            self.sample()

    def __enter__(self) -> "ThreadCPU":
        self.sample()
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.halt.set()
        self.join()
        self.sample()

    def by_name(self) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        for tid, (name, cpu) in self.seen.items():
            kind = re.sub(r"\d", "", name.split("-dataset_")[0])  # StreamingExecutor-dataset_<id>: its kind
            out[kind or name] += cpu - self.start_cpu.get(tid, 0.0)
        return {k: round(v, 3) for k, v in sorted(out.items(), key=lambda kv: -kv[1]) if v > 0}

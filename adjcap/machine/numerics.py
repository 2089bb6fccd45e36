"""Portable numerics: the same bits on every x86-64 CPU with AVX2, at a cost in speed.

PyTorch on CPU picks its kernels by the machine's instruction set: ATen's vectorised kernels (AVX2 or
AVX-512), MKL's GEMM code paths and oneDNN's JIT kernels. Each sums in its own order, so the same
seed and commit give other last bits on an AVX2 and an AVX-512 machine; the demo's tiny models then
train differently and its numbers move by whole CIDEr points. A batch's shape moves the last bits too
(GEMM blocking), so the same image could get other features in a batch of 8 than alone.

``numerics = "portable"`` (the demo preset's setting) removes both causes:

* :data:`PIN`: one code path per library whatever the CPU offers beyond AVX2 (ATen's AVX2 kernels, also
  on AVX-512 CPUs; MKL's vendor-independent conditional-numerical-reproducibility branch; oneDNN capped
  at SSE4.1) and one thread per process. Every AMD x86-64 CPU with AVX2 and FMA (since 2015) computes the
  same bits; an Intel Xeon with AVX-512 and AMX was found to compute others (2026-11-28; the cause, some
  library's Intel-only path the pin does not reach, is not found yet); :func:`cpu_problem` names a CPU
  that cannot. The libraries read these
  variables once, when they load, so a process gets them from its start: the ``adjcap`` command line
  starts itself again with them (:func:`enter`), Ray's workers get them through the job's runtime
  environment, and the tiny models are built in a fresh interpreter that has them (:func:`pinned_env`);
* :func:`per_image`: every stage computes one image at a time, so an image's features do not depend on
  the batch it came in (:func:`adjcap.engine.stages._guarded`).

``numerics = "fast"`` (every other preset) uses the machine's best kernels and whole batches: what a
GPU run or a run on real data wants. Measured costs are in docs/benchmarks/demo.md,
"Portable numerics".
"""

from __future__ import annotations

import os
import platform
import sys
import warnings
from pathlib import Path
from typing import Literal

Numerics = Literal["fast", "portable"]

PIN: dict[str, str] = {
    "ATEN_CPU_CAPABILITY": "avx2",  # ATen's AVX2 kernels, also on AVX-512 CPUs (the same code on every AVX2 CPU)
    "MKL_CBWR": "COMPATIBLE",  # MKL's one code path for every vendor (its AVX2 branch is Intel-only)
    "ONEDNN_MAX_CPU_ISA": "SSE41",  # oneDNN's JIT kernels at one level every x86-64 CPU has
    "DNNL_MAX_CPU_ISA": "SSE41",  # the same, under oneDNN's older name
    "OMP_NUM_THREADS": "1",  # one thread: no reduction split by core count
    "MKL_NUM_THREADS": "1",
    "ADJCAP_NUMERICS": "portable",  # read by per_image(): stages compute one image at a time
}


def pinned() -> bool:
    """Whether this process was started with :data:`PIN` (checked on the environment as it is now)."""
    return all(os.environ.get(k) == v for k, v in PIN.items())


def pinned_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with :data:`PIN` set: for a child process."""
    return {**(os.environ if base is None else base), **PIN}


def per_image() -> bool:
    """Stages compute one image at a time (this process runs with portable numerics)."""
    return os.environ.get("ADJCAP_NUMERICS") == "portable"


def worker_env(mode: Numerics) -> dict[str, str]:
    """What a Ray worker's environment needs for ``mode`` (nothing for ``fast``)."""
    return dict(PIN) if mode == "portable" else {}


def cpu_problem() -> str | None:
    """Why this CPU cannot give the committed portable bits (None when it can: x86-64 with AVX2 and FMA)."""
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64"):
        return (f"this CPU is {machine}, not x86-64: portable numerics pin x86 kernels, so the demo's numbers here "
                "differ from the README's (they are still reproducible on this machine)")
    try:
        flags = next((line.split(":", 1)[1].split() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("flags")), None)
    except OSError:
        flags = None
    if flags is not None and not {"avx2", "fma"} <= set(flags):
        return ("this CPU has no AVX2/FMA: ATen falls back to its baseline kernels, so the demo's numbers here "
                "differ from the README's (they are still reproducible on this machine)")
    if _vendor() == "GenuineIntel":
        return ("this CPU is Intel's: the committed bits were verified on AMD x86-64 CPUs, and on an Intel Xeon "
                "(AVX-512, AMX) the pinned build computed other tiny models (2026-11-28, at 384667d too), so the "
                "demo's numbers here differ from the README's (they are still reproducible on this machine)")
    return None


def _vendor() -> str | None:
    """The CPU's vendor id (``AuthenticAMD``, ``GenuineIntel``) from /proc/cpuinfo, or None."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("vendor_id"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


_warned = False


def enter(mode: Numerics, *, restart: bool) -> None:
    """Make this process compute with ``mode``. For ``portable`` in a process started without
    :data:`PIN`: ``restart`` (the command line, before it has done anything) starts the same command
    again with it, in place (same pid, nothing written yet); otherwise (a notebook, the Python API) one
    warning says that this process's own compute (the heads' fit, the evaluation) keeps this machine's
    kernels: the workers' features are still portable."""
    global _warned
    if mode != "portable":
        return
    problem = cpu_problem()
    if problem and not os.environ.get("ADJCAP_CPU_NOTED"):
        os.environ["ADJCAP_CPU_NOTED"] = "1"  # once, also across the restart below
        warnings.warn(problem, RuntimeWarning, stacklevel=2)
    if pinned():
        return
    if restart:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], pinned_env())
    if not _warned:
        _warned = True
        warnings.warn("numerics=portable: this process was started without adjcap.machine.numerics.PIN, so what it "
                      "computes itself (the heads' fit, the evaluation) uses this CPU's own kernels and may "
                      "differ in the last bits on another CPU; the adjcap command line sets it for you",
                      RuntimeWarning, stacklevel=2)

"""GPU failures made visible (issue 38 item 6): what counts as one, and the one line a job ends with.

A stage batch that runs out of GPU memory is retried in halves down to one image
(:func:`adjcap.engine.stages.run_batch`); one image that still does not fit, and every other accelerator
error (a CUDA / cuDNN / cuBLAS / HIP runtime error, ``torch.AcceleratorError``), is a
:class:`GpuFailure`: never an image's error row (the next images would fail the same way, and a
half-broken device poisons everything after it), but the job's end, in one line naming the stage,
its pool, the batch and the GPU's memory. Pure: imports torch only to recognise its exception types.
A pool actor that Ray gave a GPU torch cannot see (a CUDA torch on an AMD node, a driver too old for
the torch build) fails before any model loads (:func:`check_gpu_seen`), instead of running on the CPU.
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from typing import Sequence

import torch

# runtime errors whose message names the GPU stack: the device (or its library) failed, not one image
_ACCELERATOR_TEXT = re.compile(
    r"\bCUDA\b|cuDNN|CUDNN_STATUS|cuBLAS|CUBLAS_STATUS|cuFFT|cuSOLVER|NCCL|\bHIP\b|hipBLAS|MIOpen|rocBLAS"
    r"|device-side assert|illegal memory access")


class GpuFailure(RuntimeError):
    """A GPU failure that ends the job: ``str()`` is the one line the command line prints."""

    def __init__(self, line: str, *, stage: str = "", pool: str = "") -> None:
        super().__init__(line)
        self.line, self.stage, self.pool = line, stage, pool

    def in_pool(self, pool: str) -> "GpuFailure":
        """The same failure, its line naming the pool it happened in (once)."""
        if self.pool or not pool:
            return self
        return GpuFailure(f"pool {pool}, {self.line}", stage=self.stage, pool=pool)

    def __reduce__(self):  # crosses Ray's process boundary with its line and names
        return (_rebuild, (self.line, self.stage, self.pool))


def _rebuild(line: str, stage: str, pool: str) -> GpuFailure:
    return GpuFailure(line, stage=stage, pool=pool)


def is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.cuda.OutOfMemoryError)


def is_accelerator_error(e: BaseException) -> bool:
    """A GPU runtime failure other than out-of-memory (those are retried smaller)."""
    if is_oom(e):
        return False
    acc = getattr(torch, "AcceleratorError", None)
    if acc is not None and isinstance(e, acc):
        return True
    return isinstance(e, RuntimeError) and not isinstance(e, GpuFailure) and bool(_ACCELERATOR_TEXT.search(str(e)))


def memory_line(device: torch.device | str | None = None) -> str:
    """The GPU's memory in a few words: allocated and reserved by this process, free and total."""
    try:
        if not torch.cuda.is_available():
            return "no GPU visible to this process"
        dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
        if dev.type != "cuda":
            dev = torch.device("cuda", torch.cuda.current_device())
        free, total = torch.cuda.mem_get_info(dev)
        gib = 2**30
        return (f"GPU {dev.index or 0}: {torch.cuda.memory_allocated(dev) / gib:.1f} GiB allocated, "
                f"{torch.cuda.memory_reserved(dev) / gib:.1f} GiB reserved by this process, "
                f"{free / gib:.1f} GiB free of {total / gib:.1f} GiB")
    except Exception as e:  # noqa: BLE001 - a broken device cannot always say how full it is
        return f"GPU memory unknown ({type(e).__name__})"


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__


def oom_failure(stage: str, batch: int) -> GpuFailure:
    """One image of ``stage`` did not fit even alone (its batch of ``batch`` was halved down to 1)."""
    return GpuFailure(
        f"stage {stage}: out of GPU memory with one image (its batch of {batch} halved down to 1); "
        f"{memory_line()}; give the pool more of the GPU (ray.pool.<pool>.gpus), fewer actors per GPU, "
        "or precision=bf16", stage=stage)


def accelerator_failure(stage: str, batch: int, e: BaseException) -> GpuFailure:
    return GpuFailure(f"stage {stage}: GPU error in a batch of {batch} images ({first_line(e)}); {memory_line()}",
                      stage=stage)


def find(e: BaseException | None) -> GpuFailure | None:
    """The GpuFailure behind ``e`` (its causes and contexts, and what Ray wraps as ``cause``, or where Ray
    kept only its traceback's text), or None."""
    seen: dict[int, BaseException] = {}
    while e is not None and id(e) not in seen:
        seen[id(e)] = e
        inner = getattr(e, "cause", None)  # ray.exceptions.RayTaskError keeps the worker's exception
        if isinstance(inner, GpuFailure):
            return inner
        if isinstance(e, GpuFailure) and type(e) is GpuFailure:
            return e
        if isinstance(e, GpuFailure):  # Ray's dual class (RayTaskError + GpuFailure): rebuild from its args
            line = getattr(e, "line", None)
            if line:
                return GpuFailure(line, stage=getattr(e, "stage", ""), pool=getattr(e, "pool", ""))
        e = e.__cause__ or e.__context__ or (inner if isinstance(inner, BaseException) else None)
    return next(filter(None, map(_in_text, seen.values())), None)


# how a GpuFailure reads in a traceback Ray kept only as text (an actor whose constructor raised it dies
# with an ActorDiedError holding the creation task's traceback, not the exception)
_TRACEBACK_LINE = re.compile(r"^(?:adjcap\.engine\.gpu_errors\.)?GpuFailure: (.+)$", re.M)


def _in_text(e: BaseException) -> GpuFailure | None:
    found = _TRACEBACK_LINE.findall(str(e))
    return GpuFailure(found[-1].strip()) if found else None


# the device files a GPU driver creates: an NVIDIA GPU (/dev/nvidia0, ...) and AMD's ROCm (/dev/kfd)
_GPU_DEVICE_FILES = ("nvidia[0-9]*", "kfd")


def gpu_device_files(dev: Path = Path("/dev")) -> list[str]:
    """The GPU device files this machine (or container) has: a GPU is here, whatever torch makes of it."""
    return sorted(str(p) for pattern in _GPU_DEVICE_FILES for p in dev.glob(pattern))


def torch_view() -> str:
    """What torch sees, in a few words: its build, the devices it counts, the visibility variables and,
    when it sees none, why (the first line of torch's own refusal)."""
    build = (f"a CUDA {torch.version.cuda} build" if torch.version.cuda else
             f"a ROCm/HIP {torch.version.hip} build" if getattr(torch.version, "hip", None) else "a CPU-only build")
    env = ", ".join(f"{k}={os.environ[k]!r}" for k in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES",
                                                         "ROCR_VISIBLE_DEVICES") if k in os.environ)
    why = ""
    if not torch.cuda.is_available():
        try:
            torch.cuda.init()
        except Exception as e:  # noqa: BLE001 - its message is the reason shown
            why = f"; torch says {first_line(e)}"
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return f"torch {torch.__version__} ({build}) counts {count} GPUs" + (f" with {env}" if env else "") + why


def check_gpu_seen(given: Sequence[object], device: str, pool: str, node: str = "",
                   dev: Path = Path("/dev")) -> None:
    """In a pool's actor, before its models load: Ray gave it the GPUs ``given``; torch must see one.
    It is the job's end (:class:`GpuFailure`, one line naming the node and what torch sees) when the
    config demands a GPU (``device`` cuda) or when this machine has a GPU's device files (``dev``):
    a pool on a node Ray counts GPUs on would otherwise run on the CPU, silently. Ray's logical GPUs on
    a machine without any (a simulated cluster) keep running on the CPU."""
    if not given or str(device) == "cpu" or torch.cuda.is_available():
        return
    files = gpu_device_files(dev)
    if not str(device).startswith("cuda") and not files:
        return
    host = socket.gethostname() + (f" ({node})" if node and node != socket.gethostname() else "")
    has = f"the node has {', '.join(files)}" if files else "the node has no GPU device file"
    raise GpuFailure(
        f"pool {pool} on node {host}: Ray gave it GPU {', '.join(map(str, given))} but {torch_view()}; {has}; "
        "run an image whose torch matches the node's GPUs and driver (deploy/Dockerfile: CUDA 13, NVIDIA "
        "driver 580 or newer; deploy/Dockerfile.rocm: AMD)", pool=pool)

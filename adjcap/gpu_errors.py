"""GPU failures made visible (issue 38 item 6): what counts as one, and the one line a job ends with.

A stage batch that runs out of GPU memory is retried in halves down to one image
(:func:`adjcap.stages.run_batch`); one image that still does not fit, and every other accelerator
error (a CUDA / cuDNN / cuBLAS / HIP runtime error, ``torch.AcceleratorError``), is a
:class:`GpuFailure`: never an image's error row (the next images would fail the same way, and a
half-broken device poisons everything after it), but the job's end, in one line naming the stage,
its pool, the batch and the GPU's memory. Pure: imports torch only to recognise its exception types.
"""

from __future__ import annotations

import re

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
    """The GpuFailure behind ``e`` (its causes and contexts, and what Ray wraps as ``cause``), or None."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
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
    return None

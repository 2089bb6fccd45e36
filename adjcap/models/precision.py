"""Device and dtype choice shared by every model loader.

``pick_device("auto")`` is CUDA when a GPU is visible, else the CPU; explicit specs ("cpu", "cuda",
"cuda:1") are honoured and checked. ``pick_dtype("auto", device)`` is bf16 on a CUDA device that
supports it (fp16 otherwise) and fp32 on the CPU: half precision on the CPU is slow and, for
some kernels, missing.
"""

from __future__ import annotations

import torch

_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def pick_device(spec: str | torch.device | None = "auto") -> torch.device:
    """Resolve a device spec: "auto" (CUDA if available, else CPU), "cpu", "cuda", "cuda:N", "mps"."""
    if isinstance(spec, torch.device):
        device = spec
    else:
        text = (spec or "auto").strip().lower()
        if text == "auto":
            return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
        try:
            device = torch.device(text)
        except RuntimeError as e:
            raise ValueError(
                f"device '{spec}' is not a valid torch device; use 'auto', 'cpu', 'cuda' or 'cuda:N'"
            ) from e
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device '{spec}' asks for CUDA but no GPU is visible; use device='cpu' or 'auto'")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(
                f"device '{spec}' does not exist: {torch.cuda.device_count()} CUDA device(s) visible"
            )
    return device


def pick_dtype(precision: str = "auto", device: str | torch.device = "cpu") -> torch.dtype:
    """Resolve a precision name ("auto", "fp32", "fp16", "bf16") for a device.

    auto: bf16 on CUDA when the GPU supports it, else fp16; fp32 on every other device.
    """
    dev = device if isinstance(device, torch.device) else torch.device(device)
    p = (precision or "auto").strip().lower()
    if p == "auto":
        if dev.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    if p not in _DTYPES:
        raise ValueError(f"precision '{precision}' is not one of auto, fp32, fp16, bf16")
    return _DTYPES[p]


def dtype_name(dtype: torch.dtype) -> str:
    """torch.bfloat16 -> "bf16" (the names used in configs and manifests)."""
    for k, v in _DTYPES.items():
        if v == dtype:
            return k
    return str(dtype).replace("torch.", "")


def set_tf32(enabled: bool, device: str | torch.device = "auto") -> None:
    """TF32 for this process's fp32 matmuls on a CUDA device (Ampere and newer: products of 10-bit
    mantissas, fp32 accumulation, several times the fp32 rate) through torch's float32 matmul precision
    ("high"; "highest" = exact fp32). Only where the models run on CUDA: on a CPU nothing changes
    (torch's CPU kernels may read the same switch). cuDNN's convolutions use TF32 by torch's default."""
    dev = device if isinstance(device, torch.device) else None
    if dev is None:
        text = str(device or "auto").strip().lower()
        if text == "cpu" or not torch.cuda.is_available():
            return
        dev = pick_device(text)
    if dev.type != "cuda":
        return
    torch.set_float32_matmul_precision("high" if enabled else "highest")


def tf32_in_effect(enabled: bool, device: str | torch.device = "auto") -> bool | None:
    """Whether ``set_tf32(enabled, device)`` makes fp32 matmuls TF32 there: None off CUDA (a CPU: nothing to
    record), False on ROCm (torch's switch is a no-op on AMD Instinct: exact fp32) and on a CUDA GPU older
    than Ampere, else ``enabled``. A process that sees no GPU (a driver on a CPU head node) answers from the
    torch build and the configured device, the pools' GPUs being Ampere or newer (L4, A100, H100)."""
    text = str(device).strip().lower()
    if text == "cpu" or (text == "auto" and not torch.cuda.is_available()) or text.startswith(("mps", "xpu")):
        return None
    if getattr(torch.version, "hip", None):
        return False
    if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] < 8:
        return False
    return bool(enabled)

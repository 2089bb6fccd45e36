"""GPUs as torch and Ray see them: NVIDIA (CUDA) and AMD (ROCm).

torch's ROCm build presents AMD GPUs as ``cuda`` devices (``torch.cuda.is_available()``,
``torch.device("cuda")``; ``torch.version.hip`` is set), so every model loader's ``cuda`` path is the
ROCm path too. Ray counts AMD GPUs under the same ``GPU`` resource as NVIDIA ones (its AMD accelerator
manager; the node's ``accelerator_type:AMD-Instinct-...`` resource names the model) and pins each actor
to its share with ``HIP_VISIBLE_DEVICES``. Ray refuses to start on a node where only
``ROCR_VISIBLE_DEVICES`` is set (as SLURM and some container runtimes do); :func:`rocm_visible_env`
gives the ``HIP_VISIBLE_DEVICES`` that keeps the same devices visible.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

ROCR = "ROCR_VISIBLE_DEVICES"
HIP = "HIP_VISIBLE_DEVICES"


@dataclass(frozen=True)
class Gpu:
    name: str
    total_bytes: int


def backend() -> str | None:
    """"ROCm x.y" or "CUDA x.y" for the torch build when a GPU is visible, else None."""
    import torch

    if not torch.cuda.is_available():
        return None
    hip = getattr(torch.version, "hip", None)
    return f"ROCm {hip}" if hip else f"CUDA {torch.version.cuda}"


def visible_gpus() -> list[Gpu]:
    """The GPUs torch can use here (AMD ones included, through the ROCm build)."""
    import torch

    if not torch.cuda.is_available():
        return []
    return [Gpu(torch.cuda.get_device_name(i), int(torch.cuda.get_device_properties(i).total_memory))
            for i in range(torch.cuda.device_count())]


def rocm_visible_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Variables to add so that Ray starts on a node that restricts AMD GPUs with
    ``ROCR_VISIBLE_DEVICES`` only: ``HIP_VISIBLE_DEVICES`` numbering the ROCR-visible devices 0..n-1
    (HIP indexes within what ROCR exposes). Empty when nothing needs adding."""
    env = os.environ if environ is None else environ
    rocr = env.get(ROCR)
    if rocr is None or HIP in env:
        return {}
    n = len([d for d in rocr.split(",") if d.strip()])
    return {HIP: ",".join(str(i) for i in range(n))}


MPS_PIPE = "CUDA_MPS_PIPE_DIRECTORY"
# where nvidia-cuda-mps-control listens unless told otherwise: NVIDIA's fixed default, which adjcap never creates
# nor writes; it is only read, through _daemon_pipe's checks (a pipe and folder owned by root or this user),
# so what another user planted there turns nothing on (deploy/mps-start.sh refuses such a folder too)
MPS_DEFAULT_PIPE = "/tmp/nvidia-mps"


def _daemon_pipe(path: str) -> bool:
    """``path`` is a named pipe owned by root or by this process's user, in a folder (not a link to one)
    owned by root or by this user: the default folder lies in the shared /tmp, where anyone may plant one."""
    import stat

    try:
        st, folder = os.lstat(path), os.lstat(os.path.dirname(path))
    except OSError:
        return False
    mine = (0, os.getuid())
    return (stat.S_ISFIFO(st.st_mode) and st.st_uid in mine
            and stat.S_ISDIR(folder.st_mode) and folder.st_uid in mine)


def mps_status(environ: Mapping[str, str] | None = None, which=None) -> tuple[bool, str]:
    """(whether NVIDIA MPS serves this machine's CUDA processes, one line saying why): its control pipe
    (``$CUDA_MPS_PIPE_DIRECTORY/control``, else NVIDIA's fixed default /tmp/nvidia-mps/control, only read here)
    is a named pipe owned by root or by this user in a folder of theirs, as the daemon makes it (the default
    lies in the shared /tmp: anything another user planted there does not turn split pools on). A machine
    without NVIDIA's tools (no ``nvidia-smi`` / ``nvidia-cuda-mps-control``) says so."""
    import shutil

    env = os.environ if environ is None else environ
    which = shutil.which if which is None else which
    pipe = env.get(MPS_PIPE) or MPS_DEFAULT_PIPE
    control = os.path.join(pipe, "control")
    if _daemon_pipe(control):
        return True, f"on (control pipe {control})"
    if not which("nvidia-cuda-mps-control") and not which("nvidia-smi"):
        return False, "off: no NVIDIA driver tools on this machine (nvidia-smi, nvidia-cuda-mps-control)"
    how = f"{MPS_PIPE}={pipe} " if env.get(MPS_PIPE) else ""
    return False, (f"off: no MPS control pipe at {control} (start it with `{how}nvidia-cuda-mps-control -d`; "
                   "split pools sharing a GPU then time-slice it)")

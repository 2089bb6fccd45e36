"""The fused kernels of ``kernels/memattend.c`` (attention; bias + GELU): compiled on first use,
cached, called through ctypes.

MemAttend's attention (about 25 tokens, 4 heads of width 8) is the part of fitting that torch ops
run worst on a CPU: six tiny batched matrix products, a softmax and four layout copies per layer,
each a separate pass over memory. The C kernel does it in one pass per image and head (AVX2 + FMA).
The FFN's bias + exact GELU (erf) and its derivative are one pass each as well.

* Used when: x86-64 with AVX2 (``torch.backends.cpu.get_cpu_capability()``), a C compiler
  (``$CC``, else ``cc`` / ``gcc``), head width 8, at most 64 tokens, and ``ADJCAP_NATIVE`` is not
  ``0``. Otherwise :mod:`adjcap.rerank.memattend_grad` uses torch ops (same function; tests check
  both against autograd). A failed compile is reported once as a warning, never an error.
* Cache: ``$ADJCAP_NATIVE_DIR``, else ``$ADJCAP_CACHE/kernels``, else ``~/.cache/adjcap/kernels``;
  the library's name carries a hash of the source, the flags and the compiler, written
  atomically (a concurrent first use by several processes is safe).
* The calls release the GIL (ctypes does), so chunks run in parallel on fitting's worker threads.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("kernels") / "memattend.c"
FLAGS = ["-O3", "-mavx2", "-mfma", "-fno-math-errno", "-fPIC", "-shared", "-std=gnu99"]
HEAD_WIDTH = 8
MAX_TOKENS = 64

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_tried = False
_why_not: str | None = None


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def cache_dir() -> Path:
    if os.environ.get("ADJCAP_NATIVE_DIR"):
        return Path(os.environ["ADJCAP_NATIVE_DIR"]).expanduser()
    return Path(os.environ.get("ADJCAP_CACHE", "~/.cache/adjcap")).expanduser() / "kernels"


def _unsupported() -> str | None:
    if os.environ.get("ADJCAP_NATIVE", "1") == "0":
        return "disabled by ADJCAP_NATIVE=0"
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"needs x86-64, this is {platform.machine()}"
    cap = torch.backends.cpu.get_cpu_capability()
    if cap not in ("AVX2", "AVX512"):
        return f"needs AVX2, torch reports CPU capability {cap}"
    if _compiler() is None:
        return "no C compiler found (set CC)"
    return None


def _build() -> ctypes.CDLL:
    cc = _compiler()
    assert cc is not None
    src = SOURCE.read_bytes()
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    key = hashlib.sha256(src + " ".join(FLAGS + version + [platform.machine()]).encode()).hexdigest()[:16]
    out = cache_dir() / f"adjcap_memattend_{key}.so"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
        os.close(fd)
        try:
            proc = subprocess.run([cc, *FLAGS, str(SOURCE), "-o", tmp, "-lm"], capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"{cc} failed on {SOURCE}:\n{proc.stderr.strip()[-2000:]}")
            os.replace(tmp, out)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    lib = ctypes.CDLL(str(out))
    i, l, ptr = ctypes.c_int, ctypes.c_long, ctypes.c_void_p
    lib.attn_fwd.argtypes = [i, i, i, i, ptr, l, ptr, ptr, l, ptr, ptr, l, ptr]
    lib.attn_bwd.argtypes = [i, i, i, i, ptr, l, ptr, ptr, l, ptr, ptr, l, ptr, l, ptr, ptr, l]
    lib.gelu_bias_fwd.argtypes = [l, i, ptr, ptr, ptr]
    lib.gelu_bwd.argtypes = [l, i, ptr, ptr, ptr]
    for f in (lib.attn_fwd, lib.attn_bwd, lib.gelu_bias_fwd, lib.gelu_bwd):
        f.restype = ctypes.c_int
    return lib


def library() -> ctypes.CDLL | None:
    """The compiled kernel library, or None (the reason is in :func:`why_not`)."""
    global _lib, _tried, _why_not
    if _tried:
        return _lib
    with _lock:
        if not _tried:
            _why_not = _unsupported()
            if _why_not is None:
                try:
                    _lib = _build()
                except Exception as exc:  # noqa: BLE001 - any build problem means: use torch ops
                    _why_not = f"could not build the fused attention kernel ({exc}); using torch ops"
                    warnings.warn(f"adjcap: {_why_not}", RuntimeWarning, stacklevel=2)
            _tried = True
    return _lib


def why_not() -> str | None:
    """Why the kernel is not in use (None when it is)."""
    library()
    return _why_not


def usable(head_width: int, tokens: int) -> bool:
    return head_width == HEAD_WIDTH and tokens <= MAX_TOKENS and library() is not None


def reset() -> None:
    """Forget the loaded state (tests: re-read ``ADJCAP_NATIVE`` / ``CC``)."""
    global _lib, _tried, _why_not
    with _lock:
        _lib, _tried, _why_not = None, False, None


def _ptr(t: torch.Tensor | None) -> ctypes.c_void_p | None:
    return None if t is None else ctypes.c_void_p(t.data_ptr())


def _check(name: str, t: torch.Tensor, ld: int) -> None:
    if t.dtype != torch.float32 or t.device.type != "cpu" or t.dim() != 2 or t.stride(1) != 1 or t.stride(0) != ld:
        raise ValueError(f"fused attention: {name} must be a CPU float32 row-major view with row stride {ld}")


def attention_forward(
    b: int, t: int, tq: int, h: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B*tq, >=h*8] (scaled), k / v [B*t, >=h*8] row-major views (any row stride), keep
    contiguous uint8 [B, t] (nonzero: may be attended to) or None -> (o [B*tq, h*8], saved
    probabilities). Queries are each image's last tq tokens."""
    lib = library()
    assert lib is not None
    ldq, ldkv = q.stride(0), k.stride(0)
    for name, x, ld in (("q", q, ldq), ("k", k, ldkv), ("v", v, ldkv)):
        _check(name, x, ld)
    if keep is not None and (keep.dtype != torch.uint8 or not keep.is_contiguous() or tuple(keep.shape) != (b, t)):
        raise ValueError(f"fused attention: keep must be a contiguous uint8 [{b}, {t}] tensor")
    o = torch.empty(b * tq, h * HEAD_WIDTH)
    p = torch.empty(b, h, (tq + 7) // 8, t, 8)
    rc = lib.attn_fwd(b, t, tq, h, _ptr(q), ldq, _ptr(k), _ptr(v), ldkv, _ptr(keep), _ptr(o), o.stride(0), _ptr(p))
    if rc != 0:
        raise ValueError(f"fused attention: unsupported shape (tokens {t}, queries {tq}; at most {MAX_TOKENS})")
    return o, p


def attention_backward(
    b: int, t: int, tq: int, h: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: torch.Tensor,
    dout: torch.Tensor, dq: torch.Tensor, dk: torch.Tensor, dv: torch.Tensor,
) -> None:
    """Writes dq [B*tq, .] and dk / dv [B*t, .] (row-major views, dk and dv with one row stride)
    from dout [B*tq, h*8] and the forward's inputs and saved probabilities."""
    lib = library()
    assert lib is not None
    dout = dout.contiguous()
    ldq, ldkv, lddq, lddkv = q.stride(0), k.stride(0), dq.stride(0), dk.stride(0)
    for name, x, ld in (("q", q, ldq), ("k", k, ldkv), ("v", v, ldkv), ("dq", dq, lddq), ("dk", dk, lddkv), ("dv", dv, lddkv)):
        _check(name, x, ld)
    rc = lib.attn_bwd(
        b, t, tq, h, _ptr(q), ldq, _ptr(k), _ptr(v), ldkv, _ptr(p), _ptr(dout), dout.stride(0),
        _ptr(dq), lddq, _ptr(dk), _ptr(dv), lddkv,
    )
    if rc != 0:
        raise ValueError(f"fused attention: unsupported shape (tokens {t}, queries {tq}; at most {MAX_TOKENS})")


def gelu_bias_forward(x: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [rows, C] (contiguous, C a multiple of 8) -> (z = x + bias, written into x; gelu(z))."""
    lib = library()
    assert lib is not None
    if not (x.is_contiguous() and x.dtype == torch.float32 and x.shape[1] % 8 == 0):
        raise ValueError("fused gelu: x must be a contiguous float32 [rows, C] with C a multiple of 8")
    g = torch.empty_like(x)
    lib.gelu_bias_fwd(x.shape[0], x.shape[1], _ptr(x), _ptr(bias.contiguous()), _ptr(g))
    return x, g


def gelu_backward(dg: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """d gelu(z) / dz times dg, both [rows, C] contiguous."""
    lib = library()
    assert lib is not None
    dg = dg.contiguous()
    dz = torch.empty_like(z)
    lib.gelu_bwd(z.shape[0], z.shape[1], _ptr(dg), _ptr(z), _ptr(dz))
    return dz

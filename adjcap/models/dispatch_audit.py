"""What a decode would cost a GPU, counted on a CPU: host reads and KV-cache bytes moved, seen
through a ``TorchDispatchMode`` (every aten op the code runs passes through it).

* **Host reads**: the ops that make a GPU stream wait for the host: ``aten._local_scalar_dense``
  (``.item()``, ``bool(t)``, ``int(t)``), the ops whose output size depends on the data
  (``nonzero``, ``masked_select``, indexing or ``index_put_`` with a boolean mask), copies from a
  device to the CPU, and ``Tensor.tolist()`` / ``.numpy()`` / ``.cpu()`` (on a CPU tensor these
  run no aten op, so the audit wraps them while it is active). Each read is filed under its *site*:
  the innermost ``adjcap/`` frame that made it (``function:line``).
* **KV bytes moved**: bytes written by data-movement ops (copies, ``cat``, ``index_select``,
  indexing, ``gather``, ``clone``) whose input or in-place target is the KV cache: the output's
  bytes for a functional op, the source's bytes for an in-place one. Attention *reading* the cache
  is not a move. Which tensors are the cache: those the decode announces through
  :data:`adjcap.models.decoding.KV_HOOKS`; for code that announces nothing (e.g. the decode before
  issue 38, on transformers' ``DynamicCache``), any ``[rows, heads, positions>1, head_dim]``
  tensor made by ``cat`` / ``index_select`` / indexing, which is exactly what that cache does.

Steps are counted by the caller (:meth:`DispatchAudit.mark_step`, e.g. from a forward hook on the
language model head: one head call = one beam step).
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["DispatchAudit", "audit_decode"]

_ADJCAP_DIR = str(Path(__file__).resolve().parent.parent)
aten = torch.ops.aten

_SYNC_OPS = {aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default}
_INDEX_OPS = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}
_MOVE_FUNCTIONAL = {
    aten.cat.default, aten.index_select.default, aten.index_select.out, aten.index.Tensor, aten.gather.default, aten.clone.default,
    aten._to_copy.default, aten.stack.default, aten.repeat.default, aten.repeat_interleave.self_Tensor,
    aten.narrow_copy.default, aten.slice_scatter.default,
}
_MOVE_INPLACE = {aten.copy_.default, aten.index_copy_.default, aten.index_put_.default, aten._index_put_impl_.default,
                 aten.scatter_.src, aten.masked_scatter_.default}
_HF_CACHE_OPS = {aten.cat.default, aten.index_select.default, aten.index.Tensor}


def _tensors(x) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for y in x for t in _tensors(y)]
    return []


def _site() -> str:
    f = sys._getframe(2)
    while f is not None:
        fn = f.f_code.co_filename
        if fn.startswith(_ADJCAP_DIR) and not fn.endswith("dispatch_audit.py"):
            return f"{f.f_code.co_name}:{f.f_lineno}"
        f = f.f_back
    return "?"


class DispatchAudit(TorchDispatchMode):
    """Counts host reads (by site) and KV-cache bytes moved while active. ``kv_layout`` =
    (heads, head_dim) turns on the transformers-cache fallback for code that announces no cache."""

    def __init__(self, kv_layout: tuple[int, int] | None = None):
        super().__init__()
        self.kv_layout = kv_layout
        self.reads: Counter[str] = Counter()
        self.read_ops: Counter[str] = Counter()
        self.kv_bytes_moved = 0
        self.kv_bytes_moved_max_step = 0
        self._step_start_moved = 0
        self.steps = 0
        self._kv: dict[int, int] = {}  # storage data_ptr -> nbytes of the announced cache
        self.kv_cache_bytes = 0  # peak announced (or, fallback, peak per-step) cache bytes
        self._step_cache_bytes = 0
        self._patched: list[tuple[str, Callable]] = []

    # ---- the decode's announcements ---------------------------------------------------------
    def announce(self, tensors: Sequence[torch.Tensor]) -> None:
        """The decode's current KV-cache tensors (replacing what it announced before)."""
        self._kv = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
        self.kv_cache_bytes = max(self.kv_cache_bytes, sum(self._kv.values()))

    def mark_step(self) -> None:
        self.steps += 1
        self.kv_bytes_moved_max_step = max(self.kv_bytes_moved_max_step, self.kv_bytes_moved - self._step_start_moved)
        self._step_start_moved = self.kv_bytes_moved
        self.kv_cache_bytes = max(self.kv_cache_bytes, self._step_cache_bytes)
        self._step_cache_bytes = 0

    # ---- classification ---------------------------------------------------------------------
    def _is_kv(self, t: torch.Tensor) -> bool:
        if not self._kv or t.device.type == "meta":
            return False
        try:
            return t.untyped_storage().data_ptr() in self._kv
        except (RuntimeError, NotImplementedError):
            return False

    def _hf_layout(self, t: torch.Tensor) -> bool:
        if self.kv_layout is None or t.dim() != 4:
            return False
        h, dh = self.kv_layout
        return t.shape[1] == h and t.shape[3] == dh and t.shape[2] > 1

    def _read(self, kind: str) -> None:
        self.reads[_site()] += 1
        self.read_ops[kind] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _SYNC_OPS:
            self._read(func.__name__)
        elif func in _INDEX_OPS:
            idx = args[1] if len(args) > 1 else kwargs.get("indices")
            if any(t.dtype in (torch.bool, torch.uint8) for t in _tensors(idx)):
                self._read(f"{func.__name__}[bool mask]")
        elif func is aten._to_copy.default:
            dst = kwargs.get("device")
            if dst is not None and torch.device(dst).type == "cpu" and args[0].device.type != "cpu":
                self._read("copy to cpu")
        elif func is aten.copy_.default and args[0].device.type == "cpu" and args[1].device.type != "cpu":
            self._read("copy to cpu")
        out = func(*args, **kwargs)
        if func in _MOVE_INPLACE:
            target = args[0]
            if self._is_kv(target):
                src = args[-1] if func is not aten.index_put_.default else args[2]
                self.kv_bytes_moved += sum(s.nbytes for s in _tensors(src))
        elif func in _MOVE_FUNCTIONAL:
            ins = _tensors(args[0] if args else [])
            if any(self._is_kv(t) for t in ins):
                self.kv_bytes_moved += sum(o.nbytes for o in _tensors(out))
            elif not self._kv and func in _HF_CACHE_OPS and any(self._hf_layout(o) for o in _tensors(out)):
                n = sum(o.nbytes for o in _tensors(out))
                self.kv_bytes_moved += n
                if func is aten.cat.default:
                    self._step_cache_bytes += n  # the grown cache of this step
        return out

    # ---- Tensor methods that read without an aten op on a CPU tensor -------------------------
    def __enter__(self):
        from adjcap.models import decoding

        hooks = getattr(decoding, "KV_HOOKS", None)
        if hooks is not None:
            hooks.append(self.announce)
        for name in ("tolist", "numpy", "cpu"):
            orig = getattr(torch.Tensor, name)

            def wrapped(t, *a, _orig=orig, _name=name, **k):
                self._read(f"Tensor.{_name}")  # on a GPU: a copy to the host and a wait
                return _orig(t, *a, **k)

            self._patched.append((name, orig))
            setattr(torch.Tensor, name, wrapped)
        return super().__enter__()

    def __exit__(self, *exc):
        from adjcap.models import decoding

        for name, orig in self._patched:
            setattr(torch.Tensor, name, orig)
        self._patched.clear()
        hooks = getattr(decoding, "KV_HOOKS", None)
        if hooks is not None and self.announce in hooks:
            hooks.remove(self.announce)
        return super().__exit__(*exc)

    # ---- results ----------------------------------------------------------------------------
    def summary(self, per_batch_sites: Sequence[str] = ()) -> dict:
        """Totals and per-step figures; reads at ``per_batch_sites`` (function names: the gathering
        of results once per batch) are reported per batch, not per step."""
        steps = max(1, self.steps)
        per_batch = sum(n for s, n in self.reads.items() if s.split(":")[0] in per_batch_sites)
        in_steps = sum(self.reads.values()) - per_batch
        return {
            "steps": self.steps,
            "host_reads_total": sum(self.reads.values()),
            "host_reads_per_step": in_steps / steps,
            "host_reads_once_per_batch": per_batch,
            "host_reads_by_site": dict(self.reads.most_common()),
            "host_reads_by_op": dict(self.read_ops.most_common()),
            "kv_bytes_moved_per_step": self.kv_bytes_moved / steps,
            "kv_bytes_moved_max_step": max(self.kv_bytes_moved_max_step, self.kv_bytes_moved - self._step_start_moved),
            "kv_cache_bytes": self.kv_cache_bytes,
        }


def audit_decode(gpt, run: Callable[[], object], per_batch_sites: Sequence[str] | None = None) -> dict:
    """Run ``run()`` (a decode with ``gpt``) under a :class:`DispatchAudit`; one step per call of
    ``gpt.lm_head``. Returns :meth:`DispatchAudit.summary`; ``per_batch_sites`` defaults to the
    decode's own list (:data:`adjcap.models.decoding.PER_BATCH_SITES`)."""
    if per_batch_sites is None:
        from adjcap.models import decoding

        per_batch_sites = getattr(decoding, "PER_BATCH_SITES", ())
    cfg = gpt.config
    audit = DispatchAudit(kv_layout=(cfg.n_head, cfg.n_embd // cfg.n_head))
    handle = gpt.lm_head.register_forward_hook(lambda *_: audit.mark_step())
    try:
        with audit:
            run()
    finally:
        handle.remove()
    return audit.summary(per_batch_sites)

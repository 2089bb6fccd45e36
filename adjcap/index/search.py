"""Exact top-k search of the caption-embedding index (:mod:`adjcap.index.shards` holds it on disk).

:meth:`CaptionIndex.search` returns the exact top-k by cosine, best first. Ties (equal scores, e.g.
duplicate captions) are broken by the smaller corpus id, so results are deterministic.
On CPU the index is held in fp32 and scored in fp32; on CUDA it stays fp16 and queries are cast to
fp16 with fp32 accumulation and fp32 output. A GPU build without that matmul (some ROCm builds) holds
the index in fp32 instead, converted once when it loads and said once in the log
(:func:`device_dtype`), never copied per search. :func:`brute_force_topk` is the numpy reference.
"""

from __future__ import annotations

import functools
import logging
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from adjcap.index.shards import MANIFEST, NP_DTYPES, CaptionIndexError, IndexManifest, as_numpy, read_arrays, unit_rows
from adjcap.models.precision import pick_device

log = logging.getLogger(__name__)

# bytes of an fp16 index's rows scored at once on the CPU: each chunk is copied to fp32 into one buffer
# reused for the whole search (cache-sized: 5 MiB, 1,024 rows at width 1280). A fresh 80 MB fp32 copy
# per chunk cost 0.46 s of page faults and conversion per search of 200,000 x 1280; this, 0.08 s
CPU_HALF_CHUNK_BYTES = 5 << 20


def _order_desc_then_id(scores: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Per-row permutation sorting by score descending, then corpus id ascending."""
    by_id = torch.argsort(ids, dim=-1, stable=True)
    s = torch.gather(scores, -1, by_id)
    by_score = torch.argsort(s, dim=-1, descending=True, stable=True)
    return torch.gather(by_id, -1, by_score)


def _topk_rows(scores: torch.Tensor, ids_row: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k of each row of ``scores`` [B, n] (columns labelled by ``ids_row`` [n]) under the
    order (score desc, id asc); returns (scores [B, k], ids [B, k]) sorted that way."""
    n = scores.shape[1]
    k = min(k, n)
    vals, pos = torch.topk(scores, k, dim=1, largest=True, sorted=True)
    cand_ids = ids_row[pos]
    kth = vals[:, -1:]
    # rows where more columns tie with the k-th score than topk kept: the tied columns kept are those with
    # the smallest ids, all such rows at once (the chunk's one host read, whatever the number of rows)
    tied = torch.nonzero((scores >= kth).sum(dim=1) > k).flatten()
    if tied.numel():
        s_t, kth_t, vals_t = scores.index_select(0, tied), kth.index_select(0, tied), vals.index_select(0, tied)
        above = (vals_t > kth_t).sum(dim=1, keepdim=True)  # every column above the k-th is in topk's first slots
        floor = torch.iinfo(torch.int64).min + 1
        tie_ids = -torch.topk(torch.where(s_t == kth_t, -ids_row.long(), floor), k, dim=1).values  # smallest ids first
        slot = torch.arange(k, device=scores.device)
        from_tie = slot >= above  # [T, k]: slots after the columns above take the tied ids in id order
        tie_pick = tie_ids.gather(1, (slot - above).clamp(min=0)).to(cand_ids.dtype)
        vals.index_copy_(0, tied, torch.where(from_tie, kth_t.expand(-1, k), vals_t))
        cand_ids.index_copy_(0, tied, torch.where(from_tie, tie_pick, cand_ids.index_select(0, tied)))
    order = _order_desc_then_id(vals, cand_ids)
    return torch.gather(vals, 1, order), torch.gather(cand_ids, 1, order)


def _merge(a: tuple[torch.Tensor, torch.Tensor] | None, b: tuple[torch.Tensor, torch.Tensor], k: int):
    if a is None:
        return b
    s = torch.cat([a[0], b[0]], dim=1)
    i = torch.cat([a[1], b[1]], dim=1)
    order = _order_desc_then_id(s, i)[:, :k]
    return torch.gather(s, 1, order), torch.gather(i, 1, order)


@functools.cache
def half_matmul_f32(device: torch.device) -> bool:
    """Whether this torch build multiplies fp16 by fp16 into fp32 on ``device`` (fp32 accumulation and
    output, ``torch.mm(..., out_dtype=torch.float32)``): CUDA builds do; some ROCm builds do not."""
    try:
        a = torch.ones(2, 8, dtype=torch.float16, device=device)
        return torch.mm(a, a.T, out_dtype=torch.float32).dtype == torch.float32
    except (RuntimeError, TypeError, NotImplementedError):
        return False


_SAID: set[str] = set()


def device_dtype(device: torch.device, precision: str, rows: int = 0, dim: int = 0) -> torch.dtype:
    """The dtype an index of ``precision`` is held in on ``device``: fp16 on a GPU that scores fp16 into
    fp32 (:func:`half_matmul_f32`), else fp32 (the CPU; a GPU build without that matmul, converted once
    at load and said once per device in the log, instead of a copy of every chunk in every search)."""
    if device.type == "cpu" or precision != "fp16":
        return torch.float32
    if half_matmul_f32(device):
        return torch.float16
    if str(device) not in _SAID:
        _SAID.add(str(device))
        hip = getattr(torch.version, "hip", None)
        build = f"ROCm {hip}" if hip else f"torch {torch.__version__}"
        size = f" ({rows * dim * 4 / 2**30:.2f} GiB instead of {rows * dim * 2 / 2**30:.2f})" if rows and dim else ""
        log.warning(f"caption index: this {build} build has no fp16 x fp16 -> fp32 matmul on {device}; the index "
                    f"is held in fp32 there{size}, converted once when it loads")
    return torch.float32


class CaptionIndex:
    """A loaded index: all vectors on one device (fp16 on CUDA, fp32 on CPU) and their corpus ids."""

    def __init__(self, manifest: IndexManifest, vectors: torch.Tensor, ids: torch.Tensor, path: Path | None = None):
        self.manifest = manifest
        self.vectors = vectors
        self.ids = ids
        self.path = path

    @property
    def device(self) -> torch.device:
        return self.vectors.device

    @property
    def dim(self) -> int:
        return self.manifest.dim

    def __len__(self) -> int:
        return int(self.vectors.shape[0])

    @classmethod
    def load(
        cls,
        out_dir: str | Path,
        device: str | torch.device = "auto",
        *,
        encoder_id: str | None = None,
        corpus_fingerprint: str | None = None,
        checksums: bool = True,
    ) -> CaptionIndex:
        """Load and check an index. ``encoder_id`` / ``corpus_fingerprint``, when given, must match
        the manifest (an index built with another encoder or corpus is an error)."""
        out = Path(out_dir)
        manifest = IndexManifest.read(out)
        if encoder_id is not None and manifest.encoder_id != encoder_id:
            raise CaptionIndexError(
                f"{out / MANIFEST}: index built with encoder '{manifest.encoder_id}', but '{encoder_id}' is "
                "configured; rebuild the index for this encoder (or point retrieval.index_dir elsewhere)"
            )
        if corpus_fingerprint is not None and manifest.corpus_fingerprint != corpus_fingerprint:
            raise CaptionIndexError(
                f"{out / MANIFEST}: index built from corpus {manifest.corpus_fingerprint}, but the configured "
                f"corpus is {corpus_fingerprint}; rebuild the index"
            )
        dev = pick_device(device)
        store = device_dtype(dev, manifest.precision, manifest.count, manifest.dim)
        vectors, ids, _ = read_arrays(out, checksums=checksums, manifest=manifest)
        return cls(manifest, torch.from_numpy(vectors).to(dev, dtype=store), torch.from_numpy(ids).to(dev), out)

    @classmethod
    def from_stored(cls, vectors: np.ndarray, ids: np.ndarray, precision: str,
                    device: str | torch.device = "auto") -> CaptionIndex:
        """An index over unit rows as stored (``read_arrays``), e.g. read-only views of Ray's object
        store: on the CPU the arrays are used in place (no copy; fp16 is scored in fp32 chunk by chunk),
        on CUDA they are copied to the device once (fp16 stays fp16)."""
        dev = pick_device(device)
        if vectors.dtype != NP_DTYPES.get(precision):
            raise ValueError(f"stored index vectors are {vectors.dtype}, precision says {precision!r}")
        m = IndexManifest("in-memory", "in-memory", int(vectors.shape[1]), int(vectors.shape[0]), precision)
        with warnings.catch_warnings():  # read-only shared memory: never written, only read
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            v, i = torch.from_numpy(vectors), torch.from_numpy(ids)
        if dev.type != "cpu":
            v, i = v.to(dev, dtype=device_dtype(dev, precision, *vectors.shape)), i.to(dev)
        return cls(m, v, i)

    @classmethod
    def from_arrays(cls, vectors: Any, ids: Any = None, device: str | torch.device = "auto",
                    precision: str = "fp16") -> CaptionIndex:
        """An in-memory index (no files), e.g. for tests or small corpora."""
        dev = pick_device(device)
        v = unit_rows(vectors).astype(NP_DTYPES[precision])
        i = np.arange(v.shape[0], dtype=np.int64) if ids is None else as_numpy(ids).astype(np.int64)
        store = device_dtype(dev, precision, *v.shape)
        m = IndexManifest("in-memory", "in-memory", int(v.shape[1]), int(v.shape[0]), precision)
        return cls(m, torch.from_numpy(v).to(dev, dtype=store), torch.from_numpy(i).to(dev))

    @torch.inference_mode()
    def search(
        self, queries: Any, k: int, *, query_batch: int = 256, chunk_rows: int = 1 << 17
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact top-k by cosine for unit-norm queries [B, D].

        Returns (scores float32 [B, k'], corpus_ids int64 [B, k']) on the CPU, k' = min(k, len(index)),
        best first; equal scores are ordered by smaller corpus id.
        """
        if k <= 0:
            raise ValueError(f"k must be > 0; got {k}")
        q = queries if isinstance(queries, torch.Tensor) else torch.as_tensor(np.asarray(queries))
        if q.ndim != 2 or q.shape[1] != self.dim:
            raise ValueError(f"queries must be [B, {self.dim}]; got {tuple(q.shape)}")
        n = len(self)
        kk = min(k, n)
        if q.shape[0] == 0 or kk == 0:
            return torch.zeros(q.shape[0], kk), torch.zeros(q.shape[0], kk, dtype=torch.int64)
        out_s, out_i = [], []
        half = self.vectors.dtype == torch.float16
        # fp16 on the CPU (a shared, stored index): fp32 queries against fp32 copies of small chunks
        cpu_half = half and self.device.type == "cpu"
        if cpu_half:
            chunk_rows = max(1, min(chunk_rows, CPU_HALF_CHUNK_BYTES // (4 * self.dim)))
            buf = torch.empty(min(chunk_rows, n), self.dim, dtype=torch.float32)
        for qs in range(0, q.shape[0], query_batch):
            qb = q[qs : qs + query_batch].to(self.device, dtype=torch.float32 if cpu_half else self.vectors.dtype)
            best = None
            for start in range(0, n, chunk_rows):
                block = self.vectors[start : start + chunk_rows]
                if cpu_half:
                    f32 = buf[: block.shape[0]]
                    f32.copy_(block)
                    scores = qb @ f32.T
                else:
                    scores = _matmul_f32(qb, block) if half else qb.float() @ block.float().T
                best = _merge(best, _topk_rows(scores, self.ids[start : start + chunk_rows], kk), kk)
            out_s.append(best[0].float().cpu())
            out_i.append(best[1].cpu())
        return torch.cat(out_s), torch.cat(out_i)


def _matmul_f32(q16: torch.Tensor, v16: torch.Tensor) -> torch.Tensor:
    """fp16 x fp16 -> fp32 (fp32 accumulate, no fp16 rounding of the scores); an index is held in fp16
    only where this build has it (:func:`device_dtype`)."""
    return torch.mm(q16, v16.T, out_dtype=torch.float32)


def brute_force_topk(
    queries: Any, vectors: Any, ids: Any, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """Numpy reference: float32 scores of every pair, sorted by (score desc, id asc), first k."""
    q = as_numpy(queries).astype(np.float32)
    v = as_numpy(vectors).astype(np.float32)
    i = as_numpy(ids).astype(np.int64)
    scores = q @ v.T
    kk = min(k, v.shape[0])
    order = np.lexsort((np.broadcast_to(i, scores.shape), -scores), axis=-1)[:, :kk]
    return np.take_along_axis(scores, order, axis=1), i[order]

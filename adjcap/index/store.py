"""The caption-embedding index: unit-norm vectors in shards on disk, exact top-k by cosine.

On disk (one directory per encoder x corpus)::

    shard-00000.npy   float16 (or float32) [n, D] unit-norm caption embeddings
    ids-00000.npy     int64 [n] corpus ids of those rows
    shard-00000.json  the shard's sidecar: count, dim, dtype, sha256 of both files (written LAST)
    ...
    manifest.json     encoder id, corpus fingerprint, dim, count, precision, the shard list with
                      checksums (written after every shard is verified)

Every file is written to a temp name and renamed, and a shard's sidecar only after both of its
files, so a shard whose sidecar is missing or disagrees with its files is unfinished: a resumed
encode job (:func:`write_shard` / :func:`verify_shard`, one call per shard, any order, in parallel)
redoes it. :func:`finalize_index` checks all shards and writes the manifest.

:meth:`CaptionIndex.search` returns the exact top-k by cosine, best first. Ties (equal scores, e.g.
duplicate captions) are broken by the smaller corpus id, so results are deterministic.
On CPU the index is held in fp32 and scored in fp32; on CUDA it stays fp16 and queries are cast to
fp16 with fp32 accumulation and fp32 output. A GPU build without that matmul (some ROCm builds) holds
the index in fp32 instead, converted once when it loads and said once in the log
(:func:`device_dtype`), never copied per search. :func:`brute_force_topk` is the numpy reference.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import logging
import re
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from adjcap.io import atomic_write_bytes, atomic_write_json, file_checksum
from adjcap.models.precision import pick_device

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
_NP_DTYPES = {"fp16": np.float16, "fp32": np.float32}
# bytes of an fp16 index's rows scored at once on the CPU: each chunk is copied to fp32 into one buffer
# reused for the whole search (cache-sized: 5 MiB, 1,024 rows at width 1280). A fresh 80 MB fp32 copy
# per chunk cost 0.46 s of page faults and conversion per search of 200,000 x 1280; this, 0.08 s
CPU_HALF_CHUNK_BYTES = 5 << 20


class CaptionIndexError(ValueError):
    """A missing, unfinished or inconsistent index; the message names the file and what to do."""


def shard_files(out_dir: str | Path, shard_no: int) -> tuple[Path, Path, Path]:
    """(vectors, ids, sidecar) paths of shard ``shard_no``."""
    d = Path(out_dir)
    return d / f"shard-{shard_no:05d}.npy", d / f"ids-{shard_no:05d}.npy", d / f"shard-{shard_no:05d}.json"


@dataclass
class ShardInfo:
    shard: int
    count: int
    dim: int
    precision: str
    vectors: str
    ids: str
    sha256: str
    ids_sha256: str
    min_id: int = 0
    max_id: int = -1


@dataclass
class IndexManifest:
    encoder_id: str
    corpus_fingerprint: str
    dim: int
    count: int
    precision: str
    shards: list[ShardInfo] = field(default_factory=list)
    format: int = FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str = "manifest") -> IndexManifest:
        try:
            shards = [ShardInfo(**s) for s in data["shards"]]
            return cls(
                encoder_id=str(data["encoder_id"]),
                corpus_fingerprint=str(data["corpus_fingerprint"]),
                dim=int(data["dim"]),
                count=int(data["count"]),
                precision=str(data["precision"]),
                shards=shards,
                format=int(data.get("format", FORMAT_VERSION)),
                extra=dict(data.get("extra", {})),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise CaptionIndexError(f"{source}: not a valid index manifest ({e}); rebuild the index") from e

    @classmethod
    def read(cls, out_dir: str | Path) -> IndexManifest:
        path = Path(out_dir) / MANIFEST
        if not path.is_file():
            raise CaptionIndexError(
                f"{path} does not exist: the index in {Path(out_dir)} was never finished. "
                "Run the corpus encode job (adjcap encode-corpus) or build_index()"
            )
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise CaptionIndexError(f"{path}: not valid JSON ({e}); rebuild the index") from e
        return cls.from_json(data, str(path))


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------


def _npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def _as_numpy(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().to("cpu")
        if x.dtype in (torch.bfloat16,):
            x = x.float()
        return x.numpy()
    return np.asarray(x)


def unit_rows(vectors: Any) -> np.ndarray:
    """L2-normalise rows in float32 (zero rows stay zero)."""
    v = _as_numpy(vectors).astype(np.float32, copy=True)
    if v.ndim != 2:
        raise ValueError(f"embeddings must be a 2-D array [n, dim]; got shape {v.shape}")
    norms = np.linalg.norm(v, axis=1, keepdims=True)
    np.divide(v, np.maximum(norms, 1e-12), out=v)
    return v


def write_shard(
    out_dir: str | Path, shard_no: int, vectors: Any, ids: Any, *, precision: str = "fp16"
) -> ShardInfo:
    """Write one finished shard: vectors (L2-normalised, stored in ``precision``), ids, then its sidecar.

    Safe to call again for the same shard (it is replaced) and from several processes for
    different shards at once.
    """
    if precision not in _NP_DTYPES:
        raise ValueError(f"index precision must be 'fp16' or 'fp32'; got {precision!r}")
    if shard_no < 0:
        raise ValueError(f"shard number must be >= 0; got {shard_no}")
    vec = unit_rows(vectors).astype(_NP_DTYPES[precision])
    id_arr = _as_numpy(ids)
    if id_arr.ndim != 1 or id_arr.shape[0] != vec.shape[0]:
        raise ValueError(f"shard {shard_no}: {vec.shape[0]} vectors but ids of shape {id_arr.shape}")
    if id_arr.size and not np.issubdtype(id_arr.dtype, np.integer):
        raise ValueError(f"shard {shard_no}: ids must be integers; got {id_arr.dtype}")
    id_arr = id_arr.astype(np.int64)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vec_path, ids_path, side_path = shard_files(out, shard_no)
    side_path.unlink(missing_ok=True)  # the shard is unfinished until the new sidecar lands
    vec_bytes, id_bytes = _npy_bytes(vec), _npy_bytes(id_arr)
    atomic_write_bytes(vec_path, vec_bytes)
    atomic_write_bytes(ids_path, id_bytes)
    info = ShardInfo(
        shard=int(shard_no),
        count=int(vec.shape[0]),
        dim=int(vec.shape[1]),
        precision=precision,
        vectors=vec_path.name,
        ids=ids_path.name,
        sha256=hashlib.sha256(vec_bytes).hexdigest(),
        ids_sha256=hashlib.sha256(id_bytes).hexdigest(),
        min_id=int(id_arr.min()) if id_arr.size else 0,
        max_id=int(id_arr.max()) if id_arr.size else -1,
    )
    atomic_write_json(side_path, asdict(info))
    return info


def check_shard(
    out_dir: str | Path, shard_no: int, expected: ShardInfo | None = None, *, checksums: bool = True
) -> tuple[ShardInfo | None, str | None]:
    """(info, None) for a finished shard whose files match its sidecar (and ``expected``), else
    (None, reason)."""
    vec_path, ids_path, side_path = shard_files(out_dir, shard_no)
    if not side_path.is_file():
        return None, f"{side_path.name} missing (shard {shard_no} unfinished)"
    try:
        info = ShardInfo(**json.loads(side_path.read_text()))
    except (json.JSONDecodeError, TypeError) as e:
        return None, f"{side_path}: unreadable sidecar ({e})"
    if info.shard != shard_no:
        return None, f"{side_path}: sidecar is for shard {info.shard}"
    if expected is not None:
        for key in ("count", "dim", "precision", "sha256", "ids_sha256"):
            if getattr(expected, key) != getattr(info, key):
                return None, (
                    f"shard {shard_no}: {key} in the manifest ({getattr(expected, key)}) differs from "
                    f"the shard's sidecar ({getattr(info, key)})"
                )
    for path, digest in ((vec_path, info.sha256), (ids_path, info.ids_sha256)):
        if not path.is_file():
            return None, f"{path} missing"
        if checksums and file_checksum(path) != digest:
            return None, f"{path}: sha256 differs from its sidecar (file changed or half-written)"
    try:
        vec = np.load(vec_path, mmap_mode="r", allow_pickle=False)
        id_arr = np.load(ids_path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError) as e:
        return None, f"shard {shard_no}: unreadable .npy ({e})"
    if vec.shape != (info.count, info.dim) or vec.dtype != _NP_DTYPES.get(info.precision):
        return None, f"{vec_path}: shape {vec.shape} {vec.dtype}, sidecar says ({info.count}, {info.dim}) {info.precision}"
    if id_arr.shape != (info.count,) or id_arr.dtype != np.int64:
        return None, f"{ids_path}: shape {id_arr.shape} {id_arr.dtype}, sidecar says ({info.count},) int64"
    return info, None


def verify_shard(
    out_dir: str | Path, shard_no: int, expected: ShardInfo | None = None, *, checksums: bool = True
) -> ShardInfo | None:
    """The shard's info when it is finished and intact, else None (then: write it again)."""
    return check_shard(out_dir, shard_no, expected, checksums=checksums)[0]


def _shard_numbers(out_dir: Path) -> list[int]:
    nums = []
    for p in out_dir.glob("shard-*.json"):
        m = re.fullmatch(r"shard-(\d+)\.json", p.name)
        if m:
            nums.append(int(m.group(1)))
    return sorted(nums)


def finalize_index(
    out_dir: str | Path,
    *,
    encoder_id: str,
    corpus_fingerprint: str,
    num_shards: int | None = None,
    expected_count: int | None = None,
    checksums: bool = True,
    extra: dict[str, Any] | None = None,
) -> IndexManifest:
    """Verify shards 0..num_shards-1 (default: every shard with a sidecar, which must be contiguous)
    and write ``manifest.json`` last. Raises CaptionIndexError naming any unfinished shard."""
    out = Path(out_dir)
    if num_shards is None:
        found = _shard_numbers(out)
        if not found:
            raise CaptionIndexError(f"{out}: no finished shard (shard-*.json) to finalize")
        num_shards = found[-1] + 1
    infos: list[ShardInfo] = []
    problems = []
    for n in range(num_shards):
        info, why = check_shard(out, n, checksums=checksums)
        if info is None:
            problems.append(why)
        else:
            infos.append(info)
    if problems:
        raise CaptionIndexError(
            f"{out}: cannot finalize, {len(problems)} shard(s) unfinished or damaged: "
            + "; ".join(str(p) for p in problems[:5])
            + " - rerun the encode job to (re)write them"
        )
    dims = {i.dim for i in infos if i.count}
    precs = {i.precision for i in infos}
    if len(dims) > 1 or len(precs) > 1:
        raise CaptionIndexError(f"{out}: shards disagree on dim {sorted(dims)} or precision {sorted(precs)}")
    count = sum(i.count for i in infos)
    if expected_count is not None and count != expected_count:
        raise CaptionIndexError(f"{out}: shards hold {count} vectors, expected {expected_count}")
    all_ids = np.concatenate([np.load(out / i.ids, allow_pickle=False) for i in infos]) if infos else np.zeros(0)
    if np.unique(all_ids).size != all_ids.size:
        raise CaptionIndexError(f"{out}: corpus ids repeat across shards; each caption must appear once")
    dim = dims.pop() if dims else (infos[0].dim if infos else 0)
    manifest = IndexManifest(
        encoder_id=encoder_id,
        corpus_fingerprint=corpus_fingerprint,
        dim=int(dim),
        count=int(count),
        precision=precs.pop() if precs else "fp16",
        shards=infos,
        extra=dict(extra or {}),
    )
    atomic_write_json(out / MANIFEST, manifest.to_json())
    return manifest


def _batches(embeddings: Any, ids: Any) -> Iterator[tuple[np.ndarray, np.ndarray | None]]:
    """(vectors, ids-or-None) batches from: one [N, D] array/tensor, or an iterable whose items are
    [n, D] arrays/tensors or (vectors, ids) pairs; ``ids`` (flat [N]) is consumed batch by batch."""
    items: Iterable[Any] = [embeddings] if isinstance(embeddings, (np.ndarray, torch.Tensor)) else embeddings
    flat = None if ids is None else _as_numpy(ids).astype(np.int64).reshape(-1)
    pos = 0
    for item in items:
        if isinstance(item, tuple):
            vec, idx = _as_numpy(item[0]), _as_numpy(item[1]).astype(np.int64)
            if flat is not None:
                raise ValueError("build_index: give ids either with each batch or as `ids`, not both")
        else:
            vec = _as_numpy(item)
            idx = None if flat is None else flat[pos : pos + vec.shape[0]]
        if idx is not None and idx.shape[0] != vec.shape[0]:
            raise ValueError(f"build_index: {vec.shape[0]} embeddings but {idx.shape[0]} ids in a batch")
        pos += vec.shape[0]
        yield vec, idx
    if flat is not None and pos != flat.shape[0]:
        raise ValueError(f"build_index: {flat.shape[0]} ids for {pos} embeddings")


def build_index(
    out_dir: str | Path,
    embeddings: Any,
    ids: Any = None,
    *,
    encoder_id: str,
    corpus_fingerprint: str,
    shard_size: int = 65536,
    precision: str = "fp16",
    extra: dict[str, Any] | None = None,
) -> IndexManifest:
    """Build a complete index from an [N, D] array/tensor or an iterable of [n, D] batches.

    ``ids``: int64 [N] (or one array per batch); default 0..N-1 in order. Shards hold ``shard_size``
    rows each (the last may be shorter).
    """
    if shard_size <= 0:
        raise ValueError(f"shard_size must be > 0; got {shard_size}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST).unlink(missing_ok=True)
    buf_v: list[np.ndarray] = []
    buf_i: list[np.ndarray] = []
    buffered = 0
    next_id = 0
    shard_no = 0
    dim: int | None = None

    def flush(limit: int) -> None:
        nonlocal buf_v, buf_i, buffered, shard_no
        v = np.concatenate(buf_v)
        i = np.concatenate(buf_i)
        write_shard(out, shard_no, v[:limit], i[:limit], precision=precision)
        shard_no += 1
        buf_v, buf_i = [v[limit:]], [i[limit:]]
        buffered = v.shape[0] - limit

    for vec, idx in _batches(embeddings, ids):
        if vec.ndim != 2:
            raise ValueError(f"build_index: embedding batches must be [n, dim]; got {vec.shape}")
        if dim is None:
            dim = vec.shape[1]
        elif vec.shape[1] != dim:
            raise ValueError(f"build_index: embedding dim changed from {dim} to {vec.shape[1]}")
        if idx is None:
            idx = np.arange(next_id, next_id + vec.shape[0], dtype=np.int64)
        next_id += vec.shape[0]
        buf_v.append(unit_rows(vec))
        buf_i.append(np.asarray(idx, dtype=np.int64))
        buffered += vec.shape[0]
        while buffered >= shard_size:
            flush(shard_size)
    if buffered > 0 or shard_no == 0:
        if not buf_v:
            raise ValueError("build_index: no embeddings given")
        flush(buffered)
    return finalize_index(
        out, encoder_id=encoder_id, corpus_fingerprint=corpus_fingerprint, num_shards=shard_no, extra=extra
    )


# --------------------------------------------------------------------------------------------
# Searching
# --------------------------------------------------------------------------------------------


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
    # rows where more columns tie with the k-th score than topk kept: choose those by id
    n_ge = (scores >= kth).sum(dim=1)
    tied_rows = torch.nonzero(n_ge > k).flatten().tolist()
    for r in tied_rows:
        row = scores[r]
        above = torch.nonzero(row > kth[r, 0]).flatten()
        at = torch.nonzero(row == kth[r, 0]).flatten()
        at = at[torch.argsort(ids_row[at], stable=True)][: k - above.numel()]
        keep = torch.cat([above, at])
        vals[r] = row[keep]
        cand_ids[r] = ids_row[keep]
    order = _order_desc_then_id(vals, cand_ids)
    return torch.gather(vals, 1, order), torch.gather(cand_ids, 1, order)


def _merge(a: tuple[torch.Tensor, torch.Tensor] | None, b: tuple[torch.Tensor, torch.Tensor], k: int):
    if a is None:
        return b
    s = torch.cat([a[0], b[0]], dim=1)
    i = torch.cat([a[1], b[1]], dim=1)
    order = _order_desc_then_id(s, i)[:, :k]
    return torch.gather(s, 1, order), torch.gather(i, 1, order)


def read_arrays(out_dir: str | Path, *, checksums: bool = True,
                manifest: IndexManifest | None = None) -> tuple[np.ndarray, np.ndarray, str]:
    """(vectors as stored [n, dim], ids int64 [n], precision) of a finished index, every shard checked
    against its manifest; one array each, no fp32 copy of an fp16 index."""
    out = Path(out_dir)
    manifest = manifest or IndexManifest.read(out)
    dtype = _NP_DTYPES.get(manifest.precision, np.float32)
    vectors = np.empty((manifest.count, manifest.dim), dtype=dtype)
    ids = np.empty(manifest.count, dtype=np.int64)
    pos = 0
    for s in manifest.shards:
        info, why = check_shard(out, s.shard, expected=s, checksums=checksums)
        if info is None:
            raise CaptionIndexError(f"{out}: index does not match its manifest: {why}; rebuild the index")
        if pos + s.count > manifest.count:
            raise CaptionIndexError(f"{out / MANIFEST}: says {manifest.count} vectors, shards hold more")
        vectors[pos : pos + s.count] = np.load(out / s.vectors, mmap_mode="r", allow_pickle=False)
        ids[pos : pos + s.count] = np.load(out / s.ids, allow_pickle=False)
        pos += s.count
    if pos != manifest.count:
        raise CaptionIndexError(f"{out / MANIFEST}: says {manifest.count} vectors, shards hold {pos}")
    return vectors, ids, manifest.precision


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
        if vectors.dtype != _NP_DTYPES.get(precision):
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
        v = unit_rows(vectors).astype(_NP_DTYPES[precision])
        i = np.arange(v.shape[0], dtype=np.int64) if ids is None else _as_numpy(ids).astype(np.int64)
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
    q = _as_numpy(queries).astype(np.float32)
    v = _as_numpy(vectors).astype(np.float32)
    i = _as_numpy(ids).astype(np.int64)
    scores = q @ v.T
    kk = min(k, v.shape[0])
    order = np.lexsort((np.broadcast_to(i, scores.shape), -scores), axis=-1)[:, :kk]
    return np.take_along_axis(scores, order, axis=1), i[order]

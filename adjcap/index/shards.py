"""The caption-embedding index on disk: unit-norm vectors in shards, their sidecars and the manifest.

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
redoes it. :func:`finalize_index` checks all shards and writes the manifest; :func:`read_arrays`
reads a finished index back, every shard checked. Searching it: :mod:`adjcap.index.search`.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch  # unit_rows and the builders take tensors too

from adjcap.storage.io import atomic_write_bytes, atomic_write_json, file_checksum

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
NP_DTYPES = {"fp16": np.float16, "fp32": np.float32}  # precision -> the dtype its vectors are stored in


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


def as_numpy(x: Any) -> np.ndarray:
    """An array or tensor (any device; bf16 as fp32) as a numpy array."""
    if isinstance(x, torch.Tensor):
        x = x.detach().to("cpu")
        if x.dtype in (torch.bfloat16,):
            x = x.float()
        return x.numpy()
    return np.asarray(x)


def unit_rows(vectors: Any) -> np.ndarray:
    """L2-normalise rows in float32 (zero rows stay zero)."""
    v = as_numpy(vectors).astype(np.float32, copy=True)
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
    if precision not in NP_DTYPES:
        raise ValueError(f"index precision must be 'fp16' or 'fp32'; got {precision!r}")
    if shard_no < 0:
        raise ValueError(f"shard number must be >= 0; got {shard_no}")
    vec = unit_rows(vectors).astype(NP_DTYPES[precision])
    id_arr = as_numpy(ids)
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
    if vec.shape != (info.count, info.dim) or vec.dtype != NP_DTYPES.get(info.precision):
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
    flat = None if ids is None else as_numpy(ids).astype(np.int64).reshape(-1)
    pos = 0
    for item in items:
        if isinstance(item, tuple):
            vec, idx = as_numpy(item[0]), as_numpy(item[1]).astype(np.int64)
            if flat is not None:
                raise ValueError("build_index: give ids either with each batch or as `ids`, not both")
        else:
            vec = as_numpy(item)
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


def read_arrays(out_dir: str | Path, *, checksums: bool = True,
                manifest: IndexManifest | None = None) -> tuple[np.ndarray, np.ndarray, str]:
    """(vectors as stored [n, dim], ids int64 [n], precision) of a finished index, every shard checked
    against its manifest; one array each, no fp32 copy of an fp16 index."""
    out = Path(out_dir)
    manifest = manifest or IndexManifest.read(out)
    dtype = NP_DTYPES.get(manifest.precision, np.float32)
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

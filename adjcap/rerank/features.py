"""Reranker inputs read straight from the Arrow / Parquet feature tables.

One :class:`BeamFeatures` holds, for I images padded to N beam candidates and M memory tokens:

* ``scores``  [I, N, 3]  the three frozen scorers, higher = better: LM log-prob (per-token mean or
  sum, ``lm_feature``), retrieval-encoder cosine, verifier score. TriFuse's input.
* ``beam``    [I, N, 5]  MemAttend's beam tokens: LM log-prob, retrieval cosine, verifier, beam rank,
  length (``n_tokens``, the captioner's token count).
* ``memory``  [I, M, 5]  MemAttend's memory tokens, one per verified retrieval: verifier score,
  retrieval rank, length **in words** (whitespace split of the caption), then zero padding to 5 dims.
* ``mask`` [I, N] / ``memory_mask`` [I, M]: True where a candidate / verified caption exists.

``scores``, ``beam`` and ``memory`` are z-normalised per image and per column over that image's valid
entries (the beam for ``scores``/``beam``, the verified list for ``memory``). Masked entries are left out
of the statistics and set to 0; non-finite values (a NaN verifier score when the verifier is disabled,
a null rank) are treated as missing and become 0; a column that is constant over an image's valid
entries becomes 0 (never NaN). ``raw_scores`` keeps the un-normalised scorer values (NaN where masked)
for the single-scorer pickers and the Borda ranks.

Only the columns ``image_id``, ``error``, ``candidates`` and ``verified`` are read: the reranker never
sees reference captions (the feature schema has none, and nothing else is read even if present).
Rows whose ``error`` is set, or that have no candidates, are skipped; their ids are kept in
``failed_ids`` (and the reason in ``failed_reasons``) so the evaluation can count them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from adjcap.storage.io import is_temp_name

SCORE_NAMES = ("lm", "retrieval", "verifier")
BEAM_FEATURE_NAMES = ("lm", "retrieval", "verifier", "beam_rank", "n_tokens")
MEMORY_FEATURE_NAMES = ("verifier", "retrieval_rank", "n_words", "pad", "pad")
READ_COLUMNS = ("image_id", "error", "candidates", "verified")
LM_FEATURES = ("mean", "sum")


@dataclass
class BeamFeatures:
    """Padded, per-image z-normalised reranker inputs for I images (see the module docstring)."""

    image_ids: list[str]
    scores: torch.Tensor  # [I, N, 3] float32, z-normalised
    beam: torch.Tensor  # [I, N, 5] float32, z-normalised
    memory: torch.Tensor  # [I, M, 5] float32, z-normalised
    mask: torch.Tensor  # [I, N] bool
    memory_mask: torch.Tensor  # [I, M] bool
    raw_scores: torch.Tensor  # [I, N, 3] float32, NaN where masked
    beam_rank: torch.Tensor  # [I, N] int64; padded entries hold a large value
    texts: list[list[str]]  # candidate texts per image, in the row's candidate order
    lm_feature: str = "mean"
    failed_ids: list[str] = field(default_factory=list)
    failed_reasons: dict[str, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.image_ids)

    @property
    def n_images(self) -> int:
        return len(self.image_ids)

    @property
    def n_valid(self) -> torch.Tensor:
        """[I] number of candidates per image."""
        return self.mask.sum(dim=1)

    def subset(self, index: Sequence[int] | np.ndarray | torch.Tensor) -> BeamFeatures:
        """The images at ``index`` (in that order); failed ids are not carried over."""
        idx = torch.as_tensor(np.asarray(index, dtype=np.int64))
        ii = idx.tolist()
        return BeamFeatures(
            image_ids=[self.image_ids[i] for i in ii],
            scores=self.scores[idx],
            beam=self.beam[idx],
            memory=self.memory[idx],
            mask=self.mask[idx],
            memory_mask=self.memory_mask[idx],
            raw_scores=self.raw_scores[idx],
            beam_rank=self.beam_rank[idx],
            texts=[self.texts[i] for i in ii],
            lm_feature=self.lm_feature,
        )


# --------------------------------------------------------------------------------------------
# z-normalisation
# --------------------------------------------------------------------------------------------


def zscore(x: torch.Tensor | np.ndarray, mask: torch.Tensor | np.ndarray) -> torch.Tensor:
    """Per-image, per-column z-score over the valid entries.

    ``x`` is [I, N] or [I, N, C]; ``mask`` [I, N] (True = valid). Statistics (mean, population std)
    are computed in float64 over entries that are valid and finite; masked or non-finite entries
    come out as 0, and so does a column whose valid values are all equal. Returns float32.
    """
    xt = torch.as_tensor(x).to(torch.float64)
    m = torch.as_tensor(mask, dtype=torch.bool)
    squeeze = xt.dim() == 2
    if squeeze:
        xt = xt.unsqueeze(-1)
    if m.shape != xt.shape[:2]:
        raise ValueError(f"zscore: mask shape {tuple(m.shape)} does not match values {tuple(xt.shape[:2])}")
    if xt.numel() == 0:
        z0 = torch.zeros(xt.shape, dtype=torch.float32)
        return z0.squeeze(-1) if squeeze else z0
    valid = m.unsqueeze(-1) & torch.isfinite(xt)
    n = valid.sum(dim=1, keepdim=True).clamp(min=1).to(torch.float64)
    xv = torch.where(valid, xt, torch.zeros((), dtype=torch.float64))
    mean = xv.sum(dim=1, keepdim=True) / n
    dev = torch.where(valid, xt - mean, torch.zeros((), dtype=torch.float64))
    std = torch.sqrt((dev * dev).sum(dim=1, keepdim=True) / n)
    big = torch.tensor(float("inf"), dtype=torch.float64)
    hi = torch.where(valid, xt, -big).amax(dim=1, keepdim=True)
    lo = torch.where(valid, xt, big).amin(dim=1, keepdim=True)
    varying = hi > lo  # exact test: a constant column (or < 2 valid values) gives 0, never NaN
    safe_std = torch.where(varying, std, torch.ones((), dtype=torch.float64))
    z = torch.where(valid & varying, dev / safe_std, torch.zeros((), dtype=torch.float64))
    z = z.to(torch.float32)
    return z.squeeze(-1) if squeeze else z


# --------------------------------------------------------------------------------------------
# Reading tables
# --------------------------------------------------------------------------------------------


def _parquet_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.parquet") if not is_temp_name(p.name))
        if not files:
            raise FileNotFoundError(
                f"{path}: no .parquet feature parts found; feature tables are written by `adjcap run-job` "
                "under runs/<name>/features/<benchmark>-<split>/"
            )
        return files
    raise FileNotFoundError(f"{path}: no such feature table file or directory")


def read_feature_table(source: pa.Table | str | Path | Iterable[str | Path]) -> pa.Table:
    """A feature table from an Arrow table, a Parquet file, a directory of Parquet parts, or a list
    of files/directories. Only the columns the reranker needs are kept."""
    if isinstance(source, pa.Table):
        missing = [c for c in READ_COLUMNS if c not in source.schema.names]
        if missing:
            raise ValueError(
                f"feature table: not an adjcap feature table; missing columns {missing} "
                "(see adjcap.engine.features.FEATURE_SCHEMA)"
            )
        return source.select(list(READ_COLUMNS))
    paths = [source] if isinstance(source, (str, Path)) else list(source)
    tables = []
    for p in paths:
        for f in _parquet_files(Path(p)):
            schema = pq.read_schema(f)
            missing = [c for c in READ_COLUMNS if c not in schema.names]
            if missing:
                raise ValueError(
                    f"{f}: not an adjcap feature table; missing columns {missing}. "
                    "Feature tables are written by `adjcap run-job` under runs/<name>/features/."
                )
            tables.append(pq.read_table(f, columns=list(READ_COLUMNS)))
    if not tables:
        raise FileNotFoundError(f"no feature table files in {paths}")
    return pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]


def _field(values: pa.StructArray, name: str, dtype: type, fill: float) -> np.ndarray:
    arr = values.field(name)
    if arr.null_count:
        arr = pc.fill_null(arr.cast(pa.float64()), fill)
    return arr.to_numpy(zero_copy_only=False).astype(dtype, copy=False)


def _padded(flat: np.ndarray, lengths: np.ndarray, width: int, fill: float) -> np.ndarray:
    """Flat per-entry values + per-row lengths -> [rows, width] (rows truncated to width)."""
    rows = len(lengths)
    out = np.full((rows, width), fill, dtype=flat.dtype)
    if rows == 0 or width == 0:
        return out
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    pos = np.arange(len(flat), dtype=np.int64) - np.repeat(starts, lengths)
    row = np.repeat(np.arange(rows, dtype=np.int64), lengths)
    keep = pos < width
    out[row[keep], pos[keep]] = flat[keep]
    return out


def _usable_rows(ids_all: list[str], errors: list[Any], n_cand: np.ndarray) -> tuple[list[int], dict[str, str]]:
    """(the rows with candidates and no error, in image-id order; image id -> why the others failed).
    A repeated image id is an error. Image-id order, not the table's: a Ray job writes its parts in
    whatever order they finish, and the heads' fit (its minibatches) must not depend on that."""
    failed_reasons: dict[str, str] = {}
    keep_rows: list[int] = []
    seen: dict[str, int] = {}
    for r, (iid, err) in enumerate(zip(ids_all, errors)):
        if iid in seen:
            raise ValueError(
                f"feature table: image_id {iid!r} appears twice (rows {seen[iid]} and {r}); "
                "each image must have exactly one feature row"
            )
        seen[iid] = r
        if err is not None:
            failed_reasons[iid] = str(err)
        elif n_cand[r] == 0:
            failed_reasons[iid] = "no candidates in the feature row"
        else:
            keep_rows.append(r)
    keep_rows.sort(key=lambda r: ids_all[r])
    return keep_rows, failed_reasons


def _list_lengths(values: pa.ListArray) -> np.ndarray:
    return pc.fill_null(pc.list_value_length(values), 0).to_numpy(zero_copy_only=False).astype(np.int64)


@dataclass
class _BeamArrays:
    raw: np.ndarray  # [I, N, 3] LM, cosine, verifier (NaN off the mask)
    beam_raw: np.ndarray  # [I, N, 5] the above, beam rank and length
    mask: np.ndarray  # [I, N]
    rank: np.ndarray  # [I, N] beam rank, int32 max where absent
    texts: list[list[str]]


def _beam_arrays(cands: pa.ListArray, lm_feature: str, max_candidates: int | None) -> _BeamArrays:
    """The candidates' scores padded to the longest beam (or ``max_candidates``), with their texts."""
    lengths = _list_lengths(cands)
    N = int(lengths.max()) if len(cands) else 0
    if max_candidates is not None:
        N = min(N, int(max_candidates))
    flat = cands.flatten()
    lm_col = "lm_logprob_mean" if lm_feature == "mean" else "lm_logprob_sum"
    nan = float("nan")
    cols = {
        "lm": _field(flat, lm_col, np.float64, nan),
        "cos": _field(flat, "retrieval_cosine", np.float64, nan),
        "ver": _field(flat, "verifier", np.float64, nan),
        "rank": _field(flat, "beam_rank", np.float64, nan),
        "len": _field(flat, "n_tokens", np.float64, nan),
    }
    texts_flat = flat.field("text").to_pylist()
    pad = {k: _padded(v, lengths, N, nan) for k, v in cols.items()}
    mask = np.arange(N)[None, :] < np.minimum(lengths, N)[:, None]
    raw = np.stack([pad["lm"], pad["cos"], pad["ver"]], axis=-1)
    raw[~mask] = nan
    beam_raw = np.stack([pad["lm"], pad["cos"], pad["ver"], pad["rank"], pad["len"]], axis=-1)
    rank = np.where(mask & np.isfinite(pad["rank"]), pad["rank"], np.iinfo(np.int32).max)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)[:len(cands)]
    texts = [
        [t if t is not None else "" for t in texts_flat[s : s + min(n, N)]] for s, n in zip(starts, lengths)
    ]
    return _BeamArrays(raw, beam_raw, mask, rank, texts)


def _memory_arrays(verified: pa.ListArray, memory_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """(memory tokens [I, M, 5]: verifier score, retrieval rank, length in words, zero-padded to 5 dims;
    their mask [I, M])."""
    M = int(memory_tokens)
    vlen = _list_lengths(verified)
    vflat = verified.flatten()
    nan = float("nan")
    v_ver = _field(vflat, "verifier", np.float64, nan)
    v_rank = _field(vflat, "retrieval_rank", np.float64, nan)
    v_words = np.asarray([len(t.split()) if t else 0 for t in vflat.field("text").to_pylist()], np.float64)
    mem_raw = np.zeros((len(verified), M, 5), dtype=np.float64)
    mem_raw[:, :, 0] = _padded(v_ver, vlen, M, nan)
    mem_raw[:, :, 1] = _padded(v_rank, vlen, M, nan)
    mem_raw[:, :, 2] = _padded(v_words, vlen, M, nan)
    return mem_raw, np.arange(M)[None, :] < np.minimum(vlen, M)[:, None]


def load_features(
    table_or_paths: pa.Table | str | Path | Iterable[str | Path],
    lm_feature: str = "mean",
    memory_tokens: int = 5,
    max_candidates: int | None = None,
) -> BeamFeatures:
    """Read reranker inputs from a feature table (Arrow table, Parquet file, features directory or a
    list of those). ``lm_feature`` picks ``lm_logprob_mean`` or ``lm_logprob_sum``. Beams are padded
    to the longest beam (or ``max_candidates``); the verified memory to ``memory_tokens``. Rows come in
    image-id order, whatever the order of the table's rows or files."""
    if lm_feature not in LM_FEATURES:
        raise ValueError(f"scorer.lm_feature must be one of {LM_FEATURES}, got {lm_feature!r}")
    table = read_feature_table(table_or_paths)
    ids_all = [str(x) for x in table.column("image_id").to_pylist()]
    cands = table.column("candidates").combine_chunks()
    keep_rows, failed_reasons = _usable_rows(ids_all, table.column("error").to_pylist(), _list_lengths(cands))
    keep = pa.array(np.asarray(keep_rows, dtype=np.int64), type=pa.int64())
    beams = _beam_arrays(cands.take(keep), lm_feature, max_candidates)
    mem_raw, memory_mask = _memory_arrays(table.column("verified").combine_chunks().take(keep), memory_tokens)
    mask_t, mmask_t = torch.from_numpy(beams.mask), torch.from_numpy(memory_mask)
    return BeamFeatures(
        image_ids=[ids_all[r] for r in keep_rows],
        scores=zscore(torch.from_numpy(beams.raw), mask_t),
        beam=zscore(torch.from_numpy(beams.beam_raw), mask_t),
        memory=zscore(torch.from_numpy(mem_raw), mmask_t),
        mask=mask_t,
        memory_mask=mmask_t,
        raw_scores=torch.from_numpy(beams.raw.astype(np.float32)),
        beam_rank=torch.from_numpy(beams.rank.astype(np.int64)),
        texts=beams.texts,
        lm_feature=lm_feature,
        failed_ids=list(failed_reasons),
        failed_reasons=failed_reasons,
    )

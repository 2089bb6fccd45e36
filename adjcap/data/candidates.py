"""A file of caption candidates from any system (``captioner.family = candidates``): JSONL with one
object per image, or Parquet with the same columns::

    {"image": "<file path relative to the image folder, or the benchmark's image id>",
     "candidates": ["...", ...],
     "logprobs": [optional: each candidate's log-prob sum under its captioner],
     "n_tokens": [optional: the tokens each sum is over], "logprob_means": [optional]}

Without ``logprobs`` the LM judge (``captioner.candidates.lm``) scores every candidate; without
``n_tokens`` the judge's tokenizer counts them; without ``logprob_means`` the mean is sum / tokens.
A candidate's ``beam_rank`` is its place in the list. A bad file is refused in one line naming the
file, the line (the row of a Parquet file) and what to fix: not UTF-8, not JSON, a missing or
empty field, an empty or repeated candidate, lists of different lengths, an image given twice or one
the benchmark does not have.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from adjcap.data.ids import basename

OPTIONAL = ("logprobs", "n_tokens", "logprob_means")


class CandidatesError(ValueError):
    """A candidates file that cannot be used; the message names the file and line."""


@dataclass(frozen=True)
class CandidateSet:
    """One image's candidates, in the file's order, with what the file says of them."""

    image: str  # the key as written
    line: int  # 1-based line (JSONL) or row (Parquet)
    texts: tuple[str, ...]
    logprobs: tuple[float, ...] | None = None
    n_tokens: tuple[int, ...] | None = None
    logprob_means: tuple[float, ...] | None = None


def _rows(path: Path) -> Iterable[tuple[int, Any]]:
    """(line number, parsed object) of every non-blank line or Parquet row."""
    if path.suffix.lower() in (".parquet", ".pq"):
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(path)
        except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a bad file
            raise CandidatesError(f"{path}: not a readable Parquet file ({e})") from None
        for i, row in enumerate(table.to_pylist(), start=1):
            yield i, row
        return
    raw = path.read_bytes()
    for i, line in enumerate(raw.split(b"\n"), start=1):
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as e:
            raise CandidatesError(f"{path}:{i}: not valid UTF-8 (byte {e.start}); save the file as UTF-8") from None
        if not text.strip():
            continue
        try:
            yield i, json.loads(text)
        except json.JSONDecodeError as e:
            raise CandidatesError(f"{path}:{i}: not valid JSON ({e.msg} at column {e.colno}); one JSON object "
                                  "a line") from None


def _numbers(row: Mapping[str, Any], key: str, n: int, where: str, kind: type) -> tuple | None:
    v = row.get(key)
    if v is None:
        return None
    if not isinstance(v, (list, tuple)) or len(v) != n:
        raise CandidatesError(f"{where}: '{key}' must be a list of {n} numbers, one per candidate")
    out = []
    for x in v:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(float(x)):
            raise CandidatesError(f"{where}: '{key}' holds {x!r}; each must be a finite number")
        if kind is int and (float(x) != int(x) or int(x) < 1):
            raise CandidatesError(f"{where}: '{key}' holds {x!r}; each must be a whole number >= 1")
        out.append(kind(x))
    return tuple(out)


def read_candidates(path: str | Path) -> list[CandidateSet]:
    """Every image's candidates in file order (CandidatesError in one line for a bad file)."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise CandidatesError(f"candidates file {p} does not exist (captioner.candidates.file / --candidates)")
    out, seen = [], {}
    for i, row in _rows(p):
        where = f"{p}:{i}"
        if not isinstance(row, dict):
            raise CandidatesError(f"{where}: a line must be a JSON object {{\"image\": ..., \"candidates\": [...]}}")
        image = row.get("image")
        if not isinstance(image, str) or not image.strip():
            raise CandidatesError(f"{where}: 'image' is missing or empty; give the image's path relative to the "
                                  "image folder or its id")
        if image in seen:
            raise CandidatesError(f"{where}: image '{image}' again (first on line {seen[image]}); one line per image")
        seen[image] = i
        texts = row.get("candidates")
        if not isinstance(texts, (list, tuple)) or not texts:
            raise CandidatesError(f"{where}: 'candidates' must be a non-empty list of captions")
        for j, t in enumerate(texts):
            if not isinstance(t, str) or not t.strip():
                raise CandidatesError(f"{where}: candidate {j + 1} of '{image}' is empty; every candidate needs text")
            first = texts.index(t)
            if first != j:
                raise CandidatesError(f"{where}: candidate {j + 1} of '{image}' repeats candidate {first + 1} "
                                      f"({t[:40]!r}); list each caption once")
        extra = set(row) - {"image", "candidates", *OPTIONAL}
        if extra:
            raise CandidatesError(f"{where}: unknown field(s) {sorted(extra)}; the fields are image, candidates, "
                                  f"{', '.join(OPTIONAL)}")
        n = len(texts)
        lp = _numbers(row, "logprobs", n, where, float)
        nt = _numbers(row, "n_tokens", n, where, int)
        means = _numbers(row, "logprob_means", n, where, float)
        if lp is None and (nt is not None or means is not None):
            raise CandidatesError(f"{where}: 'n_tokens' / 'logprob_means' without 'logprobs'; give the sums too")
        out.append(CandidateSet(image, i, tuple(texts), lp, nt, means))
    if not out:
        raise CandidatesError(f"{p}: no candidates in the file; one JSON object a line")
    return out


class CandidateTable:
    """The file's candidate sets by image: looked up by the benchmark's image id, as written or by its
    file name (``val2014/COCO_val2014_1.jpg`` finds ``COCO_val2014_1.jpg``)."""

    def __init__(self, sets: Iterable[CandidateSet], source: str = ""):
        self.source = source
        self.sets = list(sets)
        self.by_key = {s.image: s for s in self.sets}
        by_name: dict[str, list[CandidateSet]] = {}
        for s in self.sets:
            by_name.setdefault(basename(s.image), []).append(s)
        self.by_name = by_name

    @property
    def needs_lm(self) -> bool:
        """Some image lacks log-probs: the LM judge scores its candidates."""
        return any(s.logprobs is None for s in self.sets)

    @property
    def needs_tokenizer(self) -> bool:
        """Some image lacks token counts: the LM judge's tokenizer counts them."""
        return any(s.n_tokens is None for s in self.sets)

    def get(self, image_id: str, image_path: str | None = None) -> CandidateSet | None:
        hit = self.by_key.get(image_id)
        if hit is None and image_path is not None:
            hit = self.by_key.get(image_path)
        if hit is None:
            named = self.by_name.get(basename(image_id), [])
            hit = named[0] if len(named) == 1 else None
        return hit


def match_records(table: CandidateTable, records: Iterable[Any], images_root: str | None) -> dict[str, CandidateSet]:
    """image id -> its candidates, for the benchmark's ``records``; CandidatesError (one line, naming
    the line) for a file line whose image the benchmark does not have."""
    root = Path(images_root).expanduser().resolve() if images_root else None
    out: dict[str, CandidateSet] = {}
    used: set[int] = set()
    for r in records:
        rel = None
        if root is not None and r.image_path:
            try:
                rel = str(Path(r.image_path).resolve().relative_to(root))
            except ValueError:
                rel = None
        hit = table.get(r.image_id, rel)
        if hit is not None:
            out[r.image_id] = hit
            used.add(hit.line)
    for s in table.sets:
        if s.line not in used:
            raise CandidatesError(f"{table.source}:{s.line}: image '{s.image}' is not in the benchmark (its images "
                                  "are named by their path under the image folder or their id)")
    return out


def write_candidates(path: str | Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    """Rows ``{image, candidates, logprobs?, n_tokens?, logprob_means?}`` as a JSONL candidates file
    (floats written in full: read back, they are the same numbers)."""
    from adjcap.io import atomic_write_text

    p = Path(path)
    atomic_write_text(p, "".join(json.dumps(dict(r), ensure_ascii=False) + "\n" for r in rows))
    return p

"""A file of caption candidates from any system (``captioner.family = candidates``): JSONL with one
object per image, or Parquet with the same columns::

    {"image": "<file path relative to the image folder, or the benchmark's image id>",
     "candidates": ["...", ...],
     "logprobs": [optional: each candidate's log-prob sum under its captioner],
     "n_tokens": [optional: the tokens each sum is over], "logprob_means": [optional]}

Without ``logprobs`` the LM judge (``captioner.candidates.lm``) scores every candidate; without
``n_tokens`` the judge's tokenizer counts them; without ``logprob_means`` the mean is sum / tokens.
A candidate's ``beam_rank`` is its place in the list. Everything is checked before the job starts;
a bad file is refused in one line naming the file, the line (the row of a Parquet file), the field and
what to fix:

* the file: a directory, not UTF-8, not JSON (one object a line), no rows;
* ``image``: missing, not a string, empty, a path leaving the image folder (a ``..`` part, or an
  absolute path outside it), given twice (also as two spellings of one picture: ``a.png`` and
  ``./a.png``, or ``a.png`` and ``images/a.png`` matching one benchmark image), a bare name that
  fits two pictures (``NAME`` when the folder has ``a/NAME`` and ``b/NAME``), an image the benchmark
  does not have;
* ``candidates``: not a non-empty list, a candidate that is not a string, empty, repeated, longer
  than ``captioner.candidates.max_chars`` characters, or holding text no UTF-8 file can hold (a lone
  surrogate such as ``"\\ud800"``);
* ``logprobs`` / ``logprob_means``: not one finite number per candidate, or a positive one (a
  log-probability is <= 0); ``n_tokens``: not one whole number >= 1 per candidate; ``n_tokens`` or
  ``logprob_means`` without ``logprobs``;
* the benchmark: an image the job will caption with no line in the file (unless
  ``captioner.candidates.allow_missing``; then it is an error row);
* the LM judge: a file with rows lacking ``logprobs`` needs the judge's weights, one lacking only
  ``n_tokens`` its tokenizer; either missing is named with the ``adjcap prepare`` command.

An image of the benchmark is matched to the line whose ``image`` equals its id or, path part by path
part, ends its id or is ended by it (``val2014/COCO_val2014_1.jpg`` finds ``COCO_val2014_1.jpg`` and
the reverse); never to ``b/NAME`` from ``a/NAME``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Iterable, Mapping

OPTIONAL = ("logprobs", "n_tokens", "logprob_means")
MAX_CHARS = 5000  # captioner.candidates.max_chars' default


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

    @property
    def parts(self) -> tuple[str, ...]:
        """The image's path parts (``\\`` read as ``/``, ``.`` and empty parts dropped)."""
        return path_parts(self.image)


def path_parts(key: str) -> tuple[str, ...]:
    return tuple(p for p in PurePosixPath(key.replace("\\", "/")).parts if p not in ("/", "."))


def _type(x: Any) -> str:
    return "null" if x is None else "a list" if isinstance(x, (list, tuple)) else "a number" \
        if isinstance(x, (int, float)) else type(x).__name__


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
        except ValueError as e:  # e.g. an integer of more digits than Python converts
            raise CandidatesError(f"{path}:{i}: not usable JSON ({str(e).splitlines()[0]})") from None


def _unencodable(text: str) -> str | None:
    """Why ``text`` cannot be written as UTF-8 (a lone surrogate), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"a lone surrogate {text[e.start]!r} at character {e.start + 1}, which no UTF-8 text can hold"
    return None


def _numbers(row: Mapping[str, Any], key: str, n: int, where: str, kind: type) -> tuple | None:
    v = row.get(key)
    if v is None:
        return None
    if not isinstance(v, (list, tuple)) or len(v) != n:
        raise CandidatesError(f"{where}: '{key}' must be a list of {n} numbers, one per candidate")
    out = []
    for j, x in enumerate(v, start=1):
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise CandidatesError(f"{where}: '{key}' item {j} is {_type(x)} ({str(x)[:40]}); each must be a "
                                  "finite number")
        try:
            f = float(x)
        except OverflowError:
            raise CandidatesError(f"{where}: '{key}' item {j} is an integer of {len(str(abs(x)))} digits, too "
                                  "large for a number; each must be a finite number") from None
        if not math.isfinite(f):
            raise CandidatesError(f"{where}: '{key}' item {j} is {x!r}; each must be a finite number")
        if kind is int and (f != int(x) or int(x) < 1):
            raise CandidatesError(f"{where}: '{key}' item {j} is {x!r}; each must be a whole number >= 1")
        if kind is float and f > 0:
            raise CandidatesError(f"{where}: '{key}' item {j} is {x!r}, above 0; a log-probability is <= 0 "
                                  "(give log-probs, not probabilities or negated losses)")
        out.append(kind(x))
    return tuple(out)


def _image(row: Mapping[str, Any], where: str) -> str:
    image = row.get("image")
    if image is None:
        raise CandidatesError(f"{where}: 'image' is missing; give the image's path relative to the image folder "
                              "or its id")
    if not isinstance(image, str):
        raise CandidatesError(f"{where}: 'image' is {_type(image)} ({str(image)[:40]}), not a string; give the "
                              "image's path relative to the image folder or its id, in quotes")
    if not image.strip():
        raise CandidatesError(f"{where}: 'image' is empty; give the image's path relative to the image folder "
                              "or its id")
    bad = _unencodable(image)
    if bad:
        raise CandidatesError(f"{where}: 'image' holds {bad}; fix the file's escaping")
    if ".." in path_parts(image):
        raise CandidatesError(f"{where}: image '{image}' leaves the image folder ('..'); give its path under the "
                              "image folder")
    if not path_parts(image):
        raise CandidatesError(f"{where}: image '{image}' names no file; give the image's path relative to the "
                              "image folder or its id")
    return image


def _texts(row: Mapping[str, Any], where: str, image: str, max_chars: int) -> tuple[str, ...]:
    texts = row.get("candidates")
    if not isinstance(texts, (list, tuple)) or not texts:
        raise CandidatesError(f"{where}: 'candidates' must be a non-empty list of captions")
    first: dict[str, int] = {}
    for j, t in enumerate(texts, start=1):
        what = f"candidate {j} of '{image}'"
        if not isinstance(t, str):
            raise CandidatesError(f"{where}: {what} is {_type(t)} ({str(t)[:40]}), not a string; every "
                                  "candidate is a caption in quotes")
        if not t.strip():
            raise CandidatesError(f"{where}: {what} is empty; every candidate needs text")
        if len(t) > max_chars:
            raise CandidatesError(f"{where}: {what} is {len(t)} characters, over the limit of {max_chars} "
                                  "(captioner.candidates.max_chars: raise it for long descriptions)")
        bad = _unencodable(t)
        if bad:
            raise CandidatesError(f"{where}: {what} holds {bad}; fix the file's escaping")
        if t in first:
            raise CandidatesError(f"{where}: {what} repeats candidate {first[t]} ({t[:40]!r}); list each caption "
                                  "once")
        first[t] = j
    return tuple(texts)


def read_candidates(path: str | Path, max_chars: int = MAX_CHARS) -> list[CandidateSet]:
    """Every image's candidates in file order (CandidatesError in one line for a bad file)."""
    p = Path(path).expanduser()
    if p.is_dir():
        raise CandidatesError(f"candidates file {p} is a directory, give the file (captioner.candidates.file / "
                              "--candidates)")
    if not p.is_file():
        raise CandidatesError(f"candidates file {p} does not exist (captioner.candidates.file / --candidates)")
    out: list[CandidateSet] = []
    seen: dict[tuple[str, ...], int] = {}
    for i, row in _rows(p):
        where = f"{p}:{i}"
        if not isinstance(row, dict):
            raise CandidatesError(f"{where}: a line must be a JSON object {{\"image\": ..., \"candidates\": [...]}}")
        image = _image(row, where)
        key = path_parts(image)
        if key in seen:
            raise CandidatesError(f"{where}: duplicate: image '{image}' again (first on line {seen[key]}); one line "
                                  "per image")
        seen[key] = i
        texts = _texts(row, where, image, max_chars)
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
        out.append(CandidateSet(image, i, texts, lp, nt, means))
    if not out:
        raise CandidatesError(f"{p}: no candidates in the file; one JSON object a line")
    return out


def _ends(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """One path's parts end the other's (``x/a.png`` and ``a.png``; never ``x/a.png`` and ``y/a.png``)."""
    n = min(len(a), len(b))
    return a[len(a) - n:] == b[len(b) - n:]


class CandidateTable:
    """The file's candidate sets by image: an image id finds the line whose ``image`` equals it or,
    part by part, ends it or is ended by it (``val2014/COCO_val2014_1.jpg`` finds
    ``COCO_val2014_1.jpg``); none when two lines would fit (the preflight refuses such files)."""

    def __init__(self, sets: Iterable[CandidateSet], source: str = ""):
        self.source = source
        self.sets = list(sets)
        self.by_key = {s.parts: s for s in self.sets}
        by_name: dict[str, list[CandidateSet]] = {}
        for s in self.sets:
            by_name.setdefault(s.parts[-1], []).append(s)
        self.by_name = by_name

    @property
    def needs_lm(self) -> bool:
        """Some image lacks log-probs: the LM judge scores its candidates."""
        return any(s.logprobs is None for s in self.sets)

    @property
    def needs_tokenizer(self) -> bool:
        """Some image lacks token counts: the LM judge's tokenizer counts them."""
        return any(s.n_tokens is None for s in self.sets)

    def fitting(self, image_id: str) -> list[CandidateSet]:
        """The lines that could be ``image_id``'s: the exact one, else those whose path ends its id or
        is ended by it."""
        parts = path_parts(image_id)
        hit = self.by_key.get(parts)
        if hit is not None:
            return [hit]
        return [s for s in self.by_name.get(parts[-1] if parts else "", []) if _ends(s.parts, parts)]

    def get(self, image_id: str) -> CandidateSet | None:
        fit = self.fitting(image_id)
        return fit[0] if len(fit) == 1 else None


def match_records(table: CandidateTable, records: Iterable[Any], images_root: str | None,
                  captioned: Iterable[str] | None = None, allow_missing: bool = True) -> dict[str, CandidateSet]:
    """image id -> its candidates, for the benchmark's ``records`` (every image it has), as the job
    finds them (:meth:`CandidateTable.get`). CandidatesError (one line, naming the line) for a line
    the benchmark does not have, one that is another line's picture again, a bare name fitting two
    pictures, an absolute path outside ``images_root``; and, unless ``allow_missing``, for an image of
    ``captioned`` (the ids the job will caption; default: every record) without a line."""
    records = list(records)
    root = Path(images_root).expanduser().resolve() if images_root else None
    for s in table.sets:
        if root is not None and Path(s.image).is_absolute():
            try:
                Path(s.image).resolve().relative_to(root)
            except ValueError:
                raise CandidatesError(f"{table.source}:{s.line}: image '{s.image}' is outside the image folder "
                                      f"{root}; give its path under the folder") from None
    out: dict[str, CandidateSet] = {}
    served: dict[int, str] = {}  # line -> the image id it serves
    for r in records:
        fit = table.fitting(r.image_id)
        if len(fit) > 1:
            lines = ", ".join(f"{s.line} ('{s.image}')" for s in fit[:3])
            raise CandidatesError(f"{table.source}:{fit[1].line}: duplicate: lines {lines} all name image "
                                  f"'{r.image_id}'; one line per image")
        if fit:
            s = fit[0]
            if s.line in served:
                raise CandidatesError(f"{table.source}:{s.line}: image '{s.image}' fits two images of the benchmark "
                                      f"('{served[s.line]}', '{r.image_id}'); give its path under the image folder")
            served[s.line] = r.image_id
            out[r.image_id] = s
    by_name: dict[str, list[str]] = {}
    for r in records:
        by_name.setdefault(path_parts(r.image_id)[-1] if path_parts(r.image_id) else "", []).append(r.image_id)
    line_of = {i: line for line, i in served.items()}
    for s in table.sets:
        if s.line not in served:
            again = [i for i in by_name.get(s.parts[-1], []) if _ends(path_parts(i), s.parts) and i in line_of]
            if again:
                raise CandidatesError(f"{table.source}:{s.line}: duplicate: image '{s.image}' is image '{again[0]}' "
                                      f"again (given on line {line_of[again[0]]}); one line per image")
            example = f" (e.g. '{records[0].image_id}')" if records else ""
            raise CandidatesError(f"{table.source}:{s.line}: image '{s.image}' is not in the benchmark (its images "
                                  f"are named by their path under the image folder or their id{example})")
    if not allow_missing:
        want = [r.image_id for r in records] if captioned is None else list(captioned)
        gone = [i for i in want if i not in out]
        if gone:
            from adjcap.data.records import offenders

            raise CandidatesError(f"{table.source}: images of the benchmark have no line: "
                                  f"{offenders(gone, first=3)}; add them, or set captioner.candidates."
                                  "allow_missing=true to leave them uncaptioned")
    return out


def write_candidates(path: str | Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    """Rows ``{image, candidates, logprobs?, n_tokens?, logprob_means?}`` as a JSONL candidates file
    (floats written in full: read back, they are the same numbers)."""
    from adjcap.storage.io import atomic_write_text

    p = Path(path)
    atomic_write_text(p, "".join(json.dumps(dict(r), ensure_ascii=False) + "\n" for r in rows))
    return p

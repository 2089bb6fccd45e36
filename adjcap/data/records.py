"""What a benchmark reader yields: one :class:`Record` per image, and the error every reader raises."""

from __future__ import annotations

from dataclasses import dataclass


class DataError(ValueError):
    """Bad benchmark / corpus / annotation input. The message names the file, lists the first few
    offending entries with their count, and says what to do."""


@dataclass(frozen=True)
class Record:
    """One benchmark image.

    ``image_id`` is the canonical string id (the image file name where the format has one, e.g.
    ``COCO_val2014_000000391895.jpg``; otherwise the numeric id as a string). ``image_path`` is None
    when no image root was given. ``references`` is empty only for the ``folder`` format.
    ``domain`` is set for NoCaps (``in-domain`` / ``near-domain`` / ``out-domain``).
    ``coco_id`` is the numeric COCO image id when it is known. ``error`` is set when the reader
    already knows the image cannot be used (its path escapes the image root): such a record becomes an
    error row and its file is never opened.
    """

    image_id: str
    image_path: str | None
    references: tuple[str, ...]
    split: str
    domain: str | None = None
    coco_id: int | None = None
    error: str | None = None


def offenders(items: list[str], total: int | None = None, first: int = 5) -> str:
    """``'a', 'b', 'c' and 7 more (10 in all)`` for error messages."""
    n = len(items) if total is None else total
    shown = ", ".join(repr(x) for x in items[:first])
    if n > first:
        return f"{shown} and {n - first} more ({n} in all)"
    return f"{shown} ({n} in all)"


def reject_offenders(path: object, bad: list[str], what: str) -> None:
    """DataError ``<path>: <what>: 'a', 'b' (2 in all). Fix or remove these entries.`` when ``bad``."""
    if bad:
        raise DataError(f"{path}: {what}: {offenders(bad)}. Fix or remove these entries.")

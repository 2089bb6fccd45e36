"""A job whose images failed says so (docs/guide/guarantees.md, "Failed images and the exit code").

* Any image of the run with ``error`` set: the job still writes everything (features, heads,
  predictions, metrics over the images that did not fail), then ends with one line,
  ``N of M images failed; first: <image> <reason>``, and exit code :data:`EXIT_FAILED_IMAGES`.
* More than ``ray.max_failed_share`` of the images that came back failed (checked as batches come
  back, once :data:`CHECK_AFTER` images did, and once more when all did): the job stops there, before
  fitting; the feature parts written so far are kept; the same line says it stopped, same exit code.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa

from adjcap.data.records import Record
from adjcap.storage.rundir import RunDir

EXIT_FAILED_IMAGES = 65  # EX_DATAERR (sysexits.h): the input data was incorrect
CHECK_AFTER = 32  # images back before the share is first checked (fewer in a smaller job: when all are)


class ImagesFailed(RuntimeError):
    """Images of the job failed; the message is the one summary line."""

    exit_code = EXIT_FAILED_IMAGES


class TooManyFailures(ImagesFailed):
    """More than ``ray.max_failed_share`` of the images back failed: the job stopped early."""


def line(failed: int, images: int, first: tuple[str, str] | None) -> str:
    """``N of M images failed; first: <image> <reason>``."""
    return f"{failed} of {images} images failed" + (f"; first: {first[0]} {first[1]}" if first else "")


@dataclass
class FailureWatch:
    """Counts the images as they come back (``images``: how many the job computes) and stops the job
    once more than ``max_share`` of them failed (:class:`TooManyFailures`)."""

    images: int
    max_share: float
    seen: int = 0
    failed: int = 0
    first: tuple[str, str] | None = None

    def add(self, image_ids: Sequence[str], errors: Sequence[str | None]) -> None:
        """A batch came back: count it, then check the share."""
        self.seen += len(image_ids)
        for iid, err in zip(image_ids, errors):
            if err is not None:
                self.failed += 1
                if self.first is None:
                    self.first = (iid, err)
        if self.seen >= min(self.images, CHECK_AFTER):
            self.check()

    def add_table(self, table: pa.Table) -> None:
        """A batch as :func:`adjcap.engine.batch_sink.done_columns` reports it."""
        import pyarrow.compute as pc

        errors = table.column("error")
        failed = pc.is_valid(errors)
        n_failed = int(pc.sum(failed).as_py() or 0)  # counted in Arrow: no Python per image on the driver
        first = None
        if n_failed and self.first is None:
            i = int(pc.index(failed, True).as_py())
            first = (table.column("image_id")[i].as_py(), errors[i].as_py())
        self.seen += table.num_rows
        self.failed += n_failed
        self.first = self.first or first
        if self.seen >= min(self.images, CHECK_AFTER):
            self.check()

    def check(self) -> None:
        if self.seen and self.failed > self.max_share * self.seen:
            raise TooManyFailures(
                f"{line(self.failed, self.seen, self.first)}; stopped after {self.seen} of {self.images} images: "
                f"more than ray.max_failed_share={self.max_share:g} of them failed (the feature parts written "
                "are kept; fit, predictions and metrics were skipped)")


def run_failures(run: RunDir, benchmark: str, records: Mapping[str, Sequence[Record]]) -> tuple[int, int, tuple[str, str] | None]:
    """(failed, images, first failed (image, reason)) over the run's current images, as its feature parts
    hold them (also those an earlier invocation wrote: a resumed run says so again)."""
    failed, images, first = 0, 0, None
    for split, recs in records.items():
        ids = [r.image_id for r in recs]
        images += len(ids)
        if not ids:
            continue
        errors = _errors(run, benchmark, split, ids)
        for iid in ids:
            err = errors.get(iid)
            if err is not None:
                failed += 1
                first = first or (iid, err)
    return failed, images, first


def _errors(run: RunDir, benchmark: str, split: str, ids: Iterable[str]) -> dict[str, str | None]:
    try:
        t = run.read_features(benchmark, split, image_ids=set(ids), columns=["image_id", "error"])
    except FileNotFoundError:
        return {}
    return dict(zip(t.column("image_id").to_pylist(), t.column("error").to_pylist()))


def report(run: RunDir, benchmark: str, records: Mapping[str, Sequence[Record]], strict: bool) -> None:
    """The run's summary line when any of its images failed: raised (:class:`ImagesFailed`, for the
    command line's exit code) when ``strict``, else printed (the Python API returns the run)."""
    failed, images, first = run_failures(run, benchmark, records)
    if not failed:
        return
    if strict:
        raise ImagesFailed(line(failed, images, first))
    print(line(failed, images, first))

"""Progress of a job's stages as the actors see it: each stage actor meters its batches with a
:class:`StageMeter` (the ``adjcap_*`` metrics of :mod:`actors.metrics`, and a tally on the job's
:class:`ProgressBoard`, which the driver reads to show progress)."""

from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator, Sequence

import ray

from adjcap.actors import metrics


class ProgressBoard:
    """Per stage: items done and failed, as the stage actors report them (a Ray actor, no CPU)."""

    def __init__(self) -> None:
        self.done: dict[str, int] = {}
        self.failed: dict[str, int] = {}

    def add(self, stage: str, done: int, failed: int = 0) -> None:
        self.done[stage] = self.done.get(stage, 0) + int(done)
        self.failed[stage] = self.failed.get(stage, 0) + int(failed)

    def snapshot(self) -> dict[str, dict[str, int]]:
        return {"done": dict(self.done), "failed": dict(self.failed)}


def start_board() -> Any:
    """A new board for one job (inside a Ray session): no CPU, so it never waits for one; on the
    driver's node, so that losing a worker node never loses the board."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    return ray.remote(num_cpus=0, max_restarts=0)(ProgressBoard).options(scheduling_strategy=here).remote()


class StageMeter:
    """Counts and times the batches of one stage in an actor: ``adjcap_images_processed`` /
    ``adjcap_images_failed`` / ``adjcap_batch_seconds`` (tag ``stage``) and the job's board."""

    def __init__(self, stage: str, board: Any = None, counter: str = metrics.PROCESSED):
        self.stage, self.board = stage, board
        self.tags = {"stage": stage}
        self.tagged = counter != metrics.CORPUS_ENCODED  # the corpus counter has no stage tag
        self.processed = metrics.counter(counter, stage_tag=self.tagged)
        self.failed = metrics.counter(metrics.FAILED)
        self.seconds = metrics.batch_seconds()

    def record(self, done: int, failed: int, seconds: float) -> None:
        if done:
            self.processed.inc(done, tags=self.tags if self.tagged else None)
        if failed:
            self.failed.inc(failed, tags=self.tags)
        self.seconds.observe(seconds, tags=self.tags)
        if self.board is not None:  # waited for: the tally is complete when the batch's output is
            try:
                ray.get(self.board.add.remote(self.stage, done, failed))
            except ray.exceptions.RayError:  # progress is a view: a board that is gone never fails a stage
                self.board = None

    @contextlib.contextmanager
    def batch(self, states: Sequence[Any]) -> Iterator[None]:
        """Around one stage call on ``states`` (:class:`adjcap.engine.image_state.ImageState`): every image counts
        as processed, those whose ``error`` the stage set as failed."""
        ok_before = [s.error is None for s in states]
        t = time.perf_counter()
        yield
        failed = sum(1 for ok, s in zip(ok_before, states) if ok and s.error is not None)
        self.record(len(states), failed, time.perf_counter() - t)

"""The in-process backend of :class:`adjcap.engine.executor.Executor` (tests, notebooks, benchmarks):
each block of the stream through the decode step's batch function and each pool's
:class:`adjcap.engine.pool_batch.PoolBatch`, in this process, cut into the batches Ray Data would cut
and handed on as the same Arrow tables, the models loaded once and shared by the pools."""

from __future__ import annotations

from typing import Any, Iterator, Mapping

import pyarrow as pa

from adjcap.engine.decode_task import decode_table
from adjcap.engine.executor import Executor, Stream, batches
from adjcap.engine.pool_batch import PoolBatch


class LocalExecutor(Executor):
    def __init__(self, models: Mapping[str, Any]):
        """``models``: every family the pools run, loaded in this process, by name
        (:func:`adjcap.engine.pipeline.load_models`)."""
        self.models = models

    def run(self, stream: Stream) -> Iterator[pa.Table]:
        pools = []
        for p in stream.layout:
            if p.options.get("runtime_env"):
                raise ValueError(f"pool '{p.pool}' ({' + '.join(p.meters)}) runs only on Ray: "
                                 "run the job with the Ray backend")
            pools.append((PoolBatch(stream.cfg, **p.kwargs, sink=stream.sink if p.kwargs.get("last") else None,
                                    models=self.models), stream.sizes[p.pool]))
        for block in stream.blocks():
            table = pa.concat_tables([decode_table(b, stream.preps, stream.keep_bytes)[0]
                                      for b in batches(block, stream.decode_size)])
            for pool, size in pools:
                table = pa.concat_tables([pool(b) for b in batches(table, size)], promote_options="permissive")
            yield table

"""The engine (docs/architecture.md, "Data flow of one image"): one interface that drives the stages
from a job's pools (:mod:`adjcap.engine.executor`), with an in-process backend
(:mod:`adjcap.engine.local`) and a Ray backend (``jobs/ray_backend.py``); both run the same batch
functions (:mod:`adjcap.engine.decode_task`, :mod:`adjcap.engine.pool_batch`) over the same Arrow
transport (:mod:`adjcap.engine.transport`) into the same batch sink (:mod:`adjcap.engine.batch_sink`).
Imports nothing itself (the decode tasks import :mod:`adjcap.engine.transport` without torch)."""

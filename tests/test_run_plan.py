"""A job's run plan (adjcap.engine.run_plan, docs/architecture.md "Run plan"): built once from the config
as given and resolved, it reads the records and the corpus once, and holds the identities resume and
the stage cache key by, the pool plan and the run directory, read-only. The Ray job reading its corpus
once end to end: tests/test_ray_job.py."""

import dataclasses
from unittest import mock

import pytest

import adjcap.index.lifecycle as lifecycle
from adjcap.engine import pools
from adjcap.engine.cluster_plan import PoolPlan
from adjcap.config import load_config
from adjcap.engine.identity import run_identity, stage_identities
from adjcap.engine.run_plan import RunPlan, read_records
from adjcap.engine.stage_registry import names


def _spy_corpus_reads():
    """A patch of the index lifecycle's one corpus reader that lists what it parses."""
    reads: list[str] = []
    real = lifecycle.load_corpus

    def spy(path, *args, **kwargs):
        reads.append(str(path))
        return real(path, *args, **kwargs)

    return reads, mock.patch.object(lifecycle, "load_corpus", spy)


def test_the_plan_reads_the_corpus_once_and_keys_the_run_as_before(demo_cfg, tmp_path):
    cfg = demo_cfg.model_copy(update={"limit": 3})
    rcfg = cfg.resolved()
    reads, patch = _spy_corpus_reads()
    with patch:
        plan = RunPlan.build(cfg, rcfg, tmp_path / "run")
        assert len(reads) == 1 and reads[0] == rcfg.benchmark_cfg().corpus
        # what the plan holds is what the identity functions give for the corpus it read
        assert dict(plan.stages) == stage_identities(rcfg, plan.corpus.fingerprint)
        assert plan.identity == run_identity(rcfg, plan.corpus.fingerprint)
    assert plan.given is cfg and plan.cfg is rcfg and plan.run.path == tmp_path / "run"
    assert {s: [r.image_id for r in recs] for s, recs in plan.records.items()} == \
        {s: [r.image_id for r in recs] for s, recs in read_records(rcfg).items()}
    assert all(len(recs) == 3 for recs in plan.records.values())
    assert plan.index.split("|")[1] == plan.corpus.fingerprint
    # read-only: nothing below the edge changes what the job was decided by
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.cfg = cfg
    with pytest.raises(TypeError):
        plan.records["test"] = ()
    with pytest.raises(TypeError):
        plan.stages["retrieve"] = "x"
    # without --run-dir: <runs_dir>/<preset>-<benchmark> of the resolved config
    assert RunPlan.build(cfg, rcfg).run.path.parent == tmp_path.__class__(rcfg.paths.runs_dir)


# the lavis layout reads the LAVIS environment's python (its pools' runtime_env): built by make test's prebuild,
# absent on a machine that ran only make test-fast
@pytest.mark.parametrize("sets", [[], ["ray.pools=split"], ["ray.pools=fused"],
                                  pytest.param(["verifier.backend=lavis"], marks=pytest.mark.lavis),
                                  ["ray.pool.captioner.actors=3", "ray.workers=2"]])
def test_the_pool_plan_lays_out_what_the_job_runs(sets):
    cfg = load_config("demo", sets).resolved()
    plan = PoolPlan.of(cfg)
    for gpu in (False, True):
        for first in range(len(names())):
            assert plan.layout(gpu, first) == pools.layout(cfg, gpu, first), (gpu, first)
            assert [p.batch_size for p in plan.layout(gpu, first)] == [pools.batch_size(cfg, p.name, gpu)
                                                                      for p in pools.layout(cfg, gpu, first)]
    assert plan.actors == {p.name: pools.actors(cfg, p.name) for g in (False, True) for p in pools.layout(cfg, g)}

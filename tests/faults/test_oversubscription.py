"""An impossible --workers request is refused before any model loads, in one line with the numbers;
every actor declares memory (adjcap.engine.cluster_plan.pool_plan on given cluster resources, no Ray needed)."""

import pytest

from adjcap.config import load_config
from adjcap.engine.pools import pool_names
from adjcap.engine.cluster_plan import ResourceError, pool_plan

GiB = 2**30


def _demo(workers):
    # the four split pools (auto would fuse them on this GPU-less cluster: one actor per worker)
    return load_config("demo", [f"ray.workers={workers}", "ray.pools=split"]).resolved()


def test_eight_workers_on_two_cpus_is_refused_with_the_numbers():
    with pytest.raises(ResourceError) as e:
        pool_plan(_demo(8), {"CPU": 2.0, "memory": 16 * GiB})
    msg = str(e.value)
    assert "\n" not in msg and "4 pools x 8 actors = 32 actors on 2 CPUs" in msg and "use --workers" in msg


def test_more_memory_than_the_cluster_has_is_refused():
    cfg = load_config("headline", ["paths.data_dir=/nonexistent", "ray.workers=4"]).resolved()
    with pytest.raises(ResourceError) as e:
        pool_plan(cfg, {"CPU": 64.0, "memory": 16 * GiB})
    msg = str(e.value)
    assert "\n" not in msg and "GiB of memory, the cluster has 16.0 GiB" in msg


def test_a_request_that_fits_declares_memory_for_every_actor():
    plan = pool_plan(_demo(2), {"CPU": 2.0, "memory": 16 * GiB})
    assert set(plan) == set(pool_names())
    assert all(r["memory"] > 0 and 0 < r["num_cpus"] <= 0.25 for r in plan.values())

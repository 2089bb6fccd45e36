"""Test setup: the repo root on sys.path, offline hubs, no Ray usage stats."""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def demo_cfg(tmp_path_factory):
    """The demo preset pointed at a fresh cache with the demo world and the tiny models built once."""
    from adjcap.config import load_config
    from adjcap.jobs.demo import prepare

    cache = tmp_path_factory.mktemp("adjcap-cache")
    world = os.environ.get("ADJCAP_TEST_WORLD")
    if world:  # the demo world and tiny models built once into a cache shared by test sessions (read only)
        _shared_world(Path(world).expanduser(), cache)
    cfg = load_config("demo", [f"paths.cache_dir={cache}", f"paths.runs_dir={cache / 'runs'}"])
    prepare(cfg)
    return cfg


@pytest.fixture(scope="module")
def one_local_ray(demo_cfg):
    """One embedded local Ray (no dashboard) for a module's in-process jobs: each job joins the Ray it finds
    running, as in a notebook that connected first, instead of starting and stopping its own."""
    from adjcap.jobs.ray_session import ray_session

    cfg = demo_cfg.model_copy(update={"ray": demo_cfg.ray.model_copy(update={"include_dashboard": False})})
    with ray_session(cfg.resolved()):
        yield


def _shared_world(world: Path, cache: Path) -> None:
    """Build (or reuse) the demo world and tiny models under ``world`` once, under a file lock so that
    parallel test sessions wait for one build (``make test`` builds it first: tests/prebuild.py), then
    link them into the session's own ``cache`` (runs, indexes and stage outputs stay per session)."""
    from prebuild import build_shared_world

    build_shared_world(world)
    for sub in ("demo", "tiny"):
        (cache / sub).symlink_to(world / sub, target_is_directory=True)


def pytest_configure(config):
    """``make test-fast`` (ADJCAP_TEST_FAST=1): a test that starts Ray in this process fails at once,
    naming the marker it lacks, instead of making the everyday run slow."""
    if os.environ.get("ADJCAP_TEST_FAST") != "1":
        return
    import ray

    def _refuse(*args, **kwargs):
        raise RuntimeError("make test-fast runs no Ray: mark this test (or its module) "
                           "@pytest.mark.slow so that only make test runs it")

    ray.init = _refuse


def pytest_collection_modifyitems(config, items):
    """Modules with slow or LAVIS tests first (modules kept whole, order otherwise unchanged), so that
    with two workers (make test) the long modules start at once instead of one running alone at the end."""
    heavy = {"slow", "lavis"}
    first = {item.path for item in items if heavy & {m.name for m in item.iter_markers()}}
    items.sort(key=lambda item: 0 if item.path in first else 1)

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
    from jobs.demo import prepare

    cache = tmp_path_factory.mktemp("adjcap-cache")
    cfg = load_config("demo", [f"paths.cache_dir={cache}", f"paths.runs_dir={cache / 'runs'}"])
    prepare(cfg)
    return cfg

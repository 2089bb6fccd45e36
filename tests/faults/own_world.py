"""A private copy of the demo world for the job fault tests (they damage or time its images) and the
settings that point a demo run at it, with one image per part so that kills land between parts."""

import shutil
from pathlib import Path


def own_world_settings(demo_cfg, dest: Path) -> list[str]:
    """Copy the demo world into ``dest`` and return the ``--set`` list that runs the demo on it (the
    shared cache for models and the index; every stage computed by the pools, none from the stage cache)."""
    cache = Path(demo_cfg.resolved().paths.cache_dir)
    shutil.copytree(cache / "demo", dest)
    return [f"paths.cache_dir={cache}", "ray.include_dashboard=false", "ray.rows_per_part=1", "ray.batch_size=1",
            "cache.share_stages=false",
            f"benchmarks.demo.images={dest}/images",
            f"benchmarks.demo.annotations={dest}/annotations/test_captions.json",
            f"benchmarks.demo.annotations_by_split.test={dest}/annotations/test_captions.json",
            f"benchmarks.demo.annotations_by_split.val={dest}/annotations/val_captions.json",
            f"benchmarks.demo.corpus={dest}/annotations/train_captions.json"]

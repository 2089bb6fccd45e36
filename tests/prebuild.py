"""``make test``'s first step: what the test modules would otherwise wait on, built at once before they
start. The demo world and tiny models under ``$ADJCAP_TEST_WORLD`` (CPU bound: two training processes)
and the LAVIS environment under ``$ADJCAP_CACHE`` (pip: mostly waiting on the package registry) are
built side by side, each under the same file lock the tests take, so a test session started on its
own still builds what is missing itself (and waits for a build in progress instead of repeating it).

A build that fails here is reported and left to the tests that need it, which then fail naming it."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build_shared_world(world: Path) -> None:
    """The demo world and tiny models in ``world``, built once (later calls only check them)."""
    from adjcap.config import load_config
    from adjcap.jobs.demo import prepare

    world.mkdir(parents=True, exist_ok=True)
    with open(world / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        prepare(load_config("demo", [f"paths.cache_dir={world}"]))


def lavis_cache() -> Path:
    return Path(os.environ.get("ADJCAP_CACHE", "~/.cache/adjcap")).expanduser()


def main() -> int:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    t0 = time.time()
    lavis = subprocess.Popen(
        [sys.executable, "-c", "import sys; from adjcap.models import lavis_env; lavis_env.build(sys.argv[1])", str(lavis_cache())],
        cwd=ROOT)
    world = os.environ.get("ADJCAP_TEST_WORLD")
    if world:
        try:
            build_shared_world(Path(world).expanduser())
        except Exception as e:  # noqa: BLE001 - the tests that need the world report it
            print(f"prebuild: the demo world was not built ({type(e).__name__}: {e}); the tests will say more")
    if lavis.wait() != 0:
        print("prebuild: the LAVIS environment was not built; the LAVIS tests will say why")
    print(f"prebuild: {time.time() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

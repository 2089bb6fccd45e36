"""The demo's figures from one command: ``make demo`` from an empty cache, then its digests and headline
written to ``adjcap/demo/expected.json`` and into the generated blocks of README.md, docs/guide/demo.md
and BENCHMARKS.md.

    python benchmarks/demo_figures.py            # run, write expected.json, rewrite the blocks
    python benchmarks/demo_figures.py --check    # run, compare with expected.json; exit 1 if this machine differs
    python benchmarks/demo_figures.py --run-dir runs/demo --cache ~/.cache/adjcap   # an existing demo run

It runs the real command line (``adjcap demo``), which computes with portable numerics.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from adjcap.demo import figures  # noqa: E402
from adjcap.storage.io import atomic_write_bytes  # noqa: E402


def _differences(got: dict, want: dict, prefix: str = "") -> list[str]:
    out = []
    for k in sorted(set(got) | set(want)):
        g, w = got.get(k), want.get(k)
        if isinstance(g, dict) and isinstance(w, dict):
            out += _differences(g, w, f"{prefix}{k}.")
        elif g != w:
            out.append(f"{prefix}{k}: this machine {g!r}, expected {w!r}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run-dir", type=Path, help="a finished demo run to read (default: run make demo afresh)")
    ap.add_argument("--cache", type=Path, help="its cache (with --run-dir), or where to build (default: a new "
                    "temporary directory, so the tiny models are built from scratch)")
    ap.add_argument("--check", action="store_true", help="compare with adjcap/demo/expected.json, write nothing")
    args = ap.parse_args()
    cache = args.cache or Path(tempfile.mkdtemp(prefix="adjcap-figures-"))
    run_dir = args.run_dir
    if run_dir is None:
        run_dir = cache / "runs" / "demo"
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "adjcap", "demo", "--fresh", "--run-dir", str(run_dir),
                        "--set", f"paths.cache_dir={cache}"], check=True, cwd=ROOT)
        print(f"make demo from an empty cache: {time.perf_counter() - t:.0f} s wall")
    got = figures.measure(run_dir, cache / "tiny")
    if args.check:
        diffs = _differences(got, figures.expected())
        for line in diffs:
            print(line)
        print("this machine computes the committed figures" if not diffs else
              f"{len(diffs)} figures differ from adjcap/demo/expected.json")
        return 1 if diffs else 0
    atomic_write_bytes(figures.EXPECTED, (json.dumps(got, indent=2, sort_keys=True) + "\n").encode())
    for name, render in figures.BLOCKS.items():
        path = ROOT / name
        path.write_text(figures.with_block(path.read_text(), render(got)))
    print(f"wrote {figures.EXPECTED.relative_to(ROOT)} and the generated blocks of {', '.join(figures.BLOCKS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

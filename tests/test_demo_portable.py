"""Portable numerics (adjcap.machine.numerics): the demo computes the same bits on every x86-64 CPU with AVX2.

* a training under the pin gives the same model whatever instruction sets the machine offers (emulated
  here by the libraries' own switches: MKL's instruction limit, ATen's and oneDNN's levels), while
  without the pin those switches change the model (so the emulation has teeth);
* the demo's tiny models, as this session built them, are the committed ones (adjcap/demo/expected.json);
* with per-image compute an image's features do not depend on the batch it came in;
* docs/guide/demo.md's and BENCHMARKS.md's demo figures are the committed ones (benchmarks/demo_figures.py).

The demo's predictions themselves are checked against expected.json by tests/test_demo_effect.py, on the
real ``adjcap demo``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from adjcap.machine import numerics
from adjcap.demo import figures
from adjcap.demo.tiny import model_digests

ROOT = Path(__file__).resolve().parents[1]

# a short training of the retrieval judge's class (conv patches, attention, AdamW) on a small pool
TRAIN = """
import hashlib, sys, tempfile
from pathlib import Path
from adjcap.demo.tiny import model_digests
from adjcap.demo.tiny_clip import TINY_CLIP_LARGE, build_tiny_clip
from adjcap.demo.train_base import CLIP_POOL, render_pool
from adjcap.demo.train_clip import train_clip
p = Path(tempfile.mkdtemp()) / "m.safetensors"
build_tiny_clip(p, seed=3, model=TINY_CLIP_LARGE)
train_clip(p, render_pool(3, 96, CLIP_POOL), model=TINY_CLIP_LARGE, seed=3, steps=6, batch=32, lr=5e-3,
           hard_negatives=True, threads=1)
print("DIGEST", hashlib.sha256(p.read_bytes()).hexdigest())
"""

# what a machine offers, emulated: (name, environment)
MACHINES = {
    "avx512": {"ATEN_CPU_CAPABILITY": "avx512", "MKL_ENABLE_INSTRUCTIONS": "AVX512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "sse4": {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ONEDNN_MAX_CPU_ISA": "SSE41"},
}


def _train(env: dict[str, str]) -> str:
    base = {k: v for k, v in os.environ.items() if k not in numerics.PIN}
    env = {**base, **env, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-c", TRAIN], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return next(line.split()[1] for line in res.stdout.splitlines() if line.startswith("DIGEST"))


@pytest.mark.training  # five trainings, each in a process of its own: make test runs it, make test-fast does not
def test_a_pinned_training_is_the_same_on_every_instruction_set():
    unpinned = {name: _train({**m, "OMP_NUM_THREADS": "1"}) for name, m in MACHINES.items() if name != "avx512"}
    assert unpinned["avx2"] != unpinned["sse4"], "the emulated machines should train differently without the pin"
    pinned = {name: _train(numerics.pinned_env(m)) for name, m in MACHINES.items()}
    assert len(set(pinned.values())) == 1, pinned


def test_the_tiny_models_are_the_committed_ones(demo_cfg):
    """The session's tiny world (built through build_tiny_world, in a process started with the pin) has
    the digests that every x86-64 CPU with AVX2 computes."""
    from adjcap.machine import numerics

    if numerics.cpu_problem():  # a CPU the committed bits do not hold on (it says why): nothing to compare
        pytest.skip(numerics.cpu_problem())
    root = Path(demo_cfg.resolved().paths.cache_dir) / "tiny"
    assert model_digests(root) == figures.expected()["tiny_models"]


def test_per_image_features_do_not_depend_on_the_batch(demo_cfg, monkeypatch):
    from adjcap.engine.features import rows_to_table
    from adjcap.engine.pipeline import load_models, run_pipeline
    from adjcap.engine.run_plan import read_records

    cfg = demo_cfg.resolved()
    records = read_records(cfg)["test"][:3]
    models = load_models(cfg)
    monkeypatch.setenv("ADJCAP_NUMERICS", "portable")
    assert numerics.per_image()
    together = rows_to_table(run_pipeline(records, cfg, models, batch_size=3))
    alone = rows_to_table(run_pipeline(records, cfg, models, batch_size=1))
    assert together.equals(alone)


def test_pin_and_warning(monkeypatch):
    for k in numerics.PIN:
        monkeypatch.delenv(k, raising=False)
    assert not numerics.pinned() and not numerics.per_image()
    assert numerics.worker_env("fast") == {} and numerics.worker_env("portable") == numerics.PIN
    numerics.enter("fast", restart=False)  # nothing to do
    monkeypatch.setattr(numerics, "_warned", False)
    with pytest.warns(RuntimeWarning, match="numerics=portable"):
        numerics.enter("portable", restart=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        numerics.enter("portable", restart=False)  # once per process
    for k, v in numerics.PIN.items():
        monkeypatch.setenv(k, v)
    assert numerics.pinned() and numerics.per_image()
    numerics.enter("portable", restart=True)  # already pinned: no restart


RESTART_PROBE = """
import sys
from adjcap.machine import numerics

def stop(mode, *, restart):
    print("restart" if restart else "no restart", "torch imported" if "torch" in sys.modules else "torch not imported")
    sys.exit(0)

numerics.enter = stop
from adjcap import cli

sys.argv = ["adjcap", *sys.argv[1:]]
cli.main()
"""


@pytest.mark.parametrize("args", [["run-job", "demo", "--limit", "1"], ["demo"], ["caption", "."],
                                  ["encode-corpus", "--preset", "demo", "--benchmark", "demo"]])
def test_the_command_restarts_before_it_imports_torch(args, tmp_path):
    """The portable restart (os.execve) comes before the job's imports: importing torch, open_clip and
    Ray twice cost every portable command 5-6 s."""
    done = subprocess.run([sys.executable, "-c", RESTART_PROBE, *args, "--set", f"paths.cache_dir={tmp_path}"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={k: v for k, v in os.environ.items() if k not in numerics.PIN})
    assert done.stdout.strip() == "restart torch not imported", done.stdout + done.stderr[-2000:]


@pytest.mark.parametrize("doc", sorted(figures.BLOCKS))
def test_documents_carry_the_committed_figures(doc):
    text = (ROOT / doc).read_text()
    assert figures.block_in(text) == figures.BLOCKS[doc](figures.expected()), (
        f"{doc}'s demo figures are not adjcap/demo/expected.json's: run python benchmarks/demo_figures.py")


def test_doctor_says_what_this_cpu_gives(monkeypatch, tmp_path):
    from adjcap.config import load_config
    from adjcap.machine.doctor import report

    cfg = load_config("demo", [f"paths.cache_dir={tmp_path}"]).resolved()
    monkeypatch.setattr(numerics, "cpu_problem", lambda: None)
    assert "numerics    portable: this CPU (x86-64, AVX2, FMA) computes the committed demo figures" in report(cfg)
    monkeypatch.setattr(numerics, "cpu_problem", lambda: "this CPU is aarch64, not x86-64")
    assert "numerics    portable: this CPU is aarch64, not x86-64" in report(cfg)
    assert "numerics    fast\n" in report(load_config("headline", [f"paths.cache_dir={tmp_path}"]).resolved())

"""benchmarks/gpu_probe.py --dry-run: every section runs on CPU at tiny shapes on the demo world, so the GPU
run (minutes lent, no second try) cannot fail on a typo; the JSON has each section's keys and shapes."""

import json
from pathlib import Path

import pytest

from benchmarks import gpu_probe

# torch.compile's first trace costs ~10-15 s of CPU in a fresh process: that section is dry-run apart (slow)
COMPILED = ("capture",)


def test_dry_run_runs_every_section(demo_cfg, tmp_path):
    out = tmp_path / "probe.json"
    fast = [s for s in gpu_probe.SECTIONS if s not in COMPILED]
    res = gpu_probe.main(["--dry-run", "--out", str(out), "--root", str(demo_cfg.paths.cache_dir), "--sections", *fast])
    assert json.loads(out.read_text()) == json.loads(json.dumps(res, default=str))  # written, and complete
    assert fast == [k for k in res["section_s"]]
    failed = {k: v["error"] for k, v in res.items() if isinstance(v, dict) and "error" in v}
    assert not failed, failed
    assert res["env"]["dry_run"] and not res["env"]["gpu"] and "no_gpu" in res["env"]
    # distinct synthetic images: as many as the shapes ask, of distinct sizes
    assert res["assets"]["images"] == gpu_probe.DRY.images == res["assets"]["distinct_sizes"]
    st = res["stages"]["gpu"]
    names = ("retrieve", "verify", "caption", "score")
    assert set(st["warmup"]) == set(st["steady"]) == set(names)
    for n in names:
        assert st["warmup"][n]["wall_s"] > 0 and st["warmup"][n]["gpu_busy_s"] is None  # no CUDA: null, not 0
        assert st["steady"][n]["wall_s_per_image"] > 0
        assert st["steady"][n]["launches_per_image"] is None and st["steady"][n]["top_kernels_last_batch"] is None
    assert not st["errors"] and st["candidates_per_image"] > 0
    par = res["stages"]["parity_gpu_vs_fp32"]  # the headline's fp32 against the gpu preset, the same images
    assert par["images"] == gpu_probe.DRY.images and {"retrieved", "verified", "beam"} <= set(par)
    c = res["corpus"]
    assert c["captions"] == gpu_probe.DRY.corpus and c["tokenizer"] == "FastClipTokenizer"
    job = res["ray_job"]
    assert set(job["layouts"]) == {"split-mps", "fused", "fused-x2"} and "dry run" in job["skipped"]
    assert {v["pools"] for v in job["layouts"].values()} == {"split", "fused"}
    assert (job["layouts"]["fused-x2"]["fused_actors"], job["layouts"]["fused-x2"]["fused_gpus"]) == (2, 0.5)
    assert job["layouts"]["fused"]["precision"] == "bf16"  # the gpu preset's
    assert set(res["decode"]) == {f"batch{b}_fp32" for b in gpu_probe.DRY.decode_batches}
    assert {"image_fp32", "image_bf16", "text_fp32_len1x"} <= set(res["clip"])
    assert set(res["attention"]) == {"float32", "bfloat16"} and res["index"]["captions"] == gpu_probe.DRY.index_captions


@pytest.mark.slow
def test_dry_run_compiled_sections(demo_cfg, tmp_path):
    res = gpu_probe.main(["--dry-run", "--out", str(tmp_path), "--root", str(demo_cfg.paths.cache_dir),
                          "--sections", *COMPILED])
    assert res["capture"]["eager-backend"]["same_beams"] is True and res["capture"]["eager_s"] > 0


def test_a_section_is_one_registered_function(tmp_path):
    """The registry: ``@section`` adds a section to the run and to ``--sections``; a failing section records
    its error and the next one still runs."""
    calls = []

    @gpu_probe.section
    def probe_extra(args, ctx):
        calls.append(args.shape.images)
        raise RuntimeError("boom")

    try:
        res = gpu_probe.main(["--dry-run", "--out", str(tmp_path), "--sections", "probe_extra", "attention"])
    finally:
        del gpu_probe.SECTIONS["probe_extra"]
    assert calls == [gpu_probe.DRY.images]
    assert "boom" in res["probe_extra"]["error"] and "float32" in res["attention"]
    assert (Path(tmp_path) / "gpu_probe.json").is_file()

"""Memory budget of the pools (adjcap.models.budget) and the up-front refusal of impossible
--workers / memory requests (adjcap.engine.cluster_plan.pool_plan), without starting Ray."""

import json
import struct

import pytest

from adjcap.config import load_config
from adjcap.engine import pools
from adjcap.models import budget
from adjcap.engine.cluster_plan import ACTOR_BASE_BYTES, ResourceError, actor_memory, pool_plan

GiB = 2**30


def test_headline_budget_from_the_known_architectures():
    cfg = load_config("headline", ["paths.data_dir=/nonexistent"]).resolved()
    cpu = pools.pool_budget(cfg, gpu=False)
    gpu = pools.pool_budget(cfg, gpu=True)
    big = budget.CLIP_TOWERS["ViT-bigG-14"]
    assert cpu["retriever"]["params"] == big["image"]
    # the scorer holds the text tower and BLIP, not the 1.8B-parameter image tower
    assert cpu["scorer"]["params"] == big["text"] + budget.BLIP_ITM_LARGE
    assert cpu["verifier"]["params"] == budget.BLIP_ITM_LARGE
    assert cpu["captioner"]["params"] == budget.IFCAP_PARAMS + sum(budget.CLIP_TOWERS["ViT-B-32"].values())
    # the paper's presets run fp32 everywhere
    assert cpu["retriever"]["bytes"] == gpu["retriever"]["bytes"] == 4 * big["image"]
    # "auto" precision: fp32 on the CPU, half on a GPU; the captioner's GPT-2 keeps its fp32 (its CLIP follows
    # its own setting: the root switch leaves the captioner's models)
    auto = load_config("headline", ["paths.data_dir=/nonexistent", "precision=auto", "captioner.clip.precision=auto"]).resolved()
    cpu, gpu = pools.pool_budget(auto, gpu=False), pools.pool_budget(auto, gpu=True)
    assert cpu["retriever"]["bytes"] == 4 * big["image"] and gpu["retriever"]["bytes"] == 2 * big["image"]
    vit_b = sum(budget.CLIP_TOWERS["ViT-B-32"].values())
    assert gpu["captioner"]["bytes"] == 4 * budget.IFCAP_PARAMS + 2 * vit_b


def test_local_files_count_by_safetensors_header_or_size(tmp_path):
    header = {"a": {"dtype": "F32", "shape": [3, 4], "data_offsets": [0, 48]},
              "b": {"dtype": "F16", "shape": [10], "data_offsets": [48, 68]}, "__metadata__": {"x": "y"}}
    h = json.dumps(header).encode()
    st = tmp_path / "m.safetensors"
    st.write_bytes(struct.pack("<Q", len(h)) + h + b"\0" * 68)
    assert budget.local_params(str(st)) == 22
    pt = tmp_path / "m.pt"
    pt.write_bytes(b"\0" * 4000)
    assert budget.local_params(str(pt)) == 1000
    assert budget.local_params(str(tmp_path)) == 22  # a directory: its safetensors files
    assert budget.local_params(str(tmp_path / "missing.bin")) is None


def test_demo_budget_from_the_tiny_model_files(demo_cfg):
    cfg = demo_cfg.resolved()
    b = pools.pool_budget(cfg)
    tiny_clip = budget.safetensors_params(budget.Path(cfg.retrieval.encoder.pretrained))
    assert 0 < b["retriever"]["params"] < tiny_clip and b["retriever"]["params"] + b["encoder"]["params"] == tiny_clip
    assert b["retriever"]["params"] != b["encoder"]["params"]  # counted per tower from the tensor names
    assert all(0 < b[p]["params"] < 10_000_000 for p in pools.pool_names())
    assert b["scorer"]["params"] == b["encoder"]["params"] + b["verifier"]["params"]


def _cfg(workers, **ray):
    # ray.mps=true: with GPUs, ray.pools=auto splits (adjcap.engine.pools.is_fused; without MPS it fuses)
    sets = [f"ray.workers={workers}", "ray.mps=true"] + [f"ray.{k}={v}" for k, v in ray.items()]
    return load_config("demo", sets).resolved()


def test_memory_request_is_declared_and_bounded():
    plan = pool_plan(_cfg(2), {"CPU": 16.0, "memory": 100 * GiB})
    assert all(r["memory"] >= ACTOR_BASE_BYTES for r in plan.values())
    # split pools (the default on this GPU-less cluster is one fused pool: test_fused_pool_holds_each_model_once)
    cfg = load_config("headline", ["paths.data_dir=/nonexistent", "ray.workers=2", "ray.pools=split"]).resolved()
    plan = pool_plan(cfg, {"CPU": 64.0, "memory": 1000 * GiB})
    assert plan["retriever"]["memory"] == actor_memory(4 * budget.CLIP_TOWERS["ViT-bigG-14"]["image"])
    with pytest.raises(ResourceError) as e:
        pool_plan(cfg, {"CPU": 64.0, "memory": 24 * GiB})
    msg = str(e.value)
    assert "\n" not in msg and "of memory, the cluster has 24.0 GiB" in msg and "retriever" in msg


def test_gpu_shares_must_fit_the_gpus():
    cfg = _cfg(2)
    plan = pool_plan(cfg, {"CPU": 16.0, "GPU": 2.0, "memory": 100 * GiB})
    assert all(r["num_gpus"] == 0.25 for r in plan.values())
    with pytest.raises(ResourceError, match=r"need 0.25 \+ 0.25 \+ 0.25 \+ 0.25 GPU x 8 = 8 GPUs, the cluster has 2"):
        pool_plan(_cfg(8), {"CPU": 64.0, "GPU": 2.0, "memory": 100 * GiB})


def test_scorer_counts_the_encoders_it_loads_beyond_the_retrieval_text_tower():
    """The scorer pool loads the CLIPScore encoder (both towers) when it is another model than the output
    scorer, and the output encoder's both towers when it is not the retrieval encoder (roles.load_scorer)."""
    big, rn = budget.CLIP_TOWERS["ViT-bigG-14"], budget.CLIP_TOWERS["RN50x64"]
    ifcap = pools.pool_budget(load_config("ifcap", ["paths.data_dir=/nonexistent"]).resolved(), gpu=False)
    # RN50x64 retrieves (its text tower scores); CLIPScore is bigG, another model: both its towers; no verifier
    assert ifcap["scorer"]["params"] == rn["text"] + sum(big.values())
    vitb = pools.pool_budget(load_config("output-scorer-vitb32", ["paths.data_dir=/nonexistent"]).resolved(), gpu=False)
    b32 = sum(budget.CLIP_TOWERS["ViT-B-32"].values())
    assert vitb["scorer"]["params"] == b32 + sum(big.values()) + budget.BLIP_ITM_LARGE


def test_cpu_16gb_preset_fits_a_16_gb_machine_where_the_headline_does_not():
    """A 16 GB machine's local Ray offers about 70% of it for actors (the rest is its object store)."""
    cluster = {"CPU": 8.0, "memory": 0.7 * 16 * GiB}
    small = load_config("cpu-16gb", ["paths.data_dir=/nonexistent"]).resolved()
    plan = pool_plan(small, cluster)
    assert sum(r["memory"] for r in plan.values()) < 0.7 * 16 * GiB
    b = pools.pool_budget(small, gpu=False)
    l14 = budget.CLIP_TOWERS["ViT-L-14"]
    assert b["retriever"]["params"] == l14["image"] and b["verifier"]["params"] == budget.BLIP_ITM_BASE
    with pytest.raises(ResourceError):
        pool_plan(load_config("headline", ["paths.data_dir=/nonexistent"]).resolved(), cluster)


def test_the_corpus_encoder_asks_for_its_corpus_and_one_shard():
    """An encode-corpus actor holds the corpus ids and one shard's tokens and embeddings beyond its model
    (the texts stay in the CPU tasks that tokenise them): the request grows by them (with the working
    factor), so Ray's issue detector sees no under-declared pool."""
    extra = budget.corpus_encode_bytes(1000, shard_size=16384, width=1280)
    assert extra >= 8 * 1000 + 16384 * (10 * 1280 + 8 * 77)
    assert budget.corpus_encode_bytes(2000, 16384, 1280) - extra == 8 * 1000  # grows with the corpus's ids
    cfg = _cfg(1)
    cluster = {"CPU": 16.0, "memory": 100 * GiB}
    plain = pool_plan(cfg, cluster, ("encoder",))["encoder"]["memory"]
    more = pool_plan(cfg, cluster, ("encoder",), {"encoder": extra})["encoder"]["memory"]
    assert more - plain == pytest.approx(1.25 * extra, abs=2)


def test_decoding_tasks_are_bounded_by_the_workers():
    """At most ray.decode_tasks image-decoding tasks at once, by default 2 x workers (unbounded, Ray
    Data starts one per free decode_cpus of the cluster: tests/test_multinode.py counts them)."""
    from adjcap.jobs.ray_backend import decode_tasks

    assert decode_tasks(load_config("demo", ["ray.workers=4"])) == 8
    assert decode_tasks(load_config("demo", ["ray.workers=4", "ray.decode_tasks=3"])) == 3


def test_fused_pool_holds_each_model_once():
    """ray.pools=fused (auto without GPUs): one actor holds every stage's models, each once (the scorer
    reuses the retrieval encoder and the verifier), so it asks for less than one actor of every split pool."""
    cfg = load_config("headline", ["paths.data_dir=/nonexistent"]).resolved()
    b = pools.pool_budget(cfg, gpu=False)
    big = budget.CLIP_TOWERS["ViT-bigG-14"]
    assert b["fused"]["params"] == sum(big.values()) + budget.BLIP_ITM_LARGE + b["captioner"]["params"]
    assert b["fused"]["params"] == sum(b[p]["params"] for p in pools.pool_names()) - budget.BLIP_ITM_LARGE
    cluster = {"CPU": 64.0, "memory": 1000 * GiB}
    auto = pool_plan(cfg, cluster)
    assert set(auto) == {"fused"} and auto["fused"]["memory"] == actor_memory(b["fused"]["bytes"], "fused")
    split = pool_plan(load_config("headline", ["paths.data_dir=/nonexistent", "ray.pools=split"]).resolved(), cluster)
    assert set(split) == set(pools.pool_names())
    assert auto["fused"]["memory"] < sum(r["memory"] for r in split.values())
    # with GPUs auto splits under MPS, else fuses; fused asks for the split pools' shares together (one GPU)
    gpus = {"CPU": 16.0, "GPU": 2.0, "memory": 1000 * GiB}
    assert set(pool_plan(cfg.model_copy(update={"ray": cfg.ray.model_copy(update={"mps": True})}), gpus)) == set(pools.pool_names())
    assert set(pool_plan(cfg.model_copy(update={"ray": cfg.ray.model_copy(update={"mps": False})}), gpus)) == {"fused"}
    fused = load_config("headline", ["paths.data_dir=/nonexistent", "ray.pools=fused", "ray.workers=2"]).resolved()
    assert pool_plan(fused, gpus)["fused"]["num_gpus"] == 1.0
    three = load_config("headline", ["paths.data_dir=/nonexistent", "ray.pools=fused", "ray.workers=3"]).resolved()
    with pytest.raises(ResourceError, match="1 pool x 3 actors need 1 GPU x 3 = 3 GPUs, the cluster has 2"):
        pool_plan(three, gpus)


def test_pool_actors_and_shares_are_data():
    """One GPU holds one retriever, verifier and scorer and three captioners (ray.pool.captioner.actors)."""
    one_gpu = {"CPU": 16.0, "GPU": 1.0, "memory": 100 * GiB}
    cfg = _cfg(1, gpu_share=0.15, **{"pool.captioner.actors": 3})
    plan = pool_plan(cfg, one_gpu)
    assert all(r["num_gpus"] == 0.15 for r in plan.values())
    assert pools.actors(cfg, "captioner") == 3 and pools.actors(cfg, "retriever") == 1
    with pytest.raises(ResourceError) as e:
        pool_plan(_cfg(1, **{"pool.captioner.actors": 4}), one_gpu)
    msg = str(e.value)
    assert "\n" not in msg and "captioner 4" in msg and "= 1.75 GPUs, the cluster has 1" in msg
    own = pool_plan(_cfg(1, **{"pool.captioner.gpus": 0.25, "pool.verifier.gpus": 0.1, "pool.scorer.cpus": 2}), one_gpu)
    assert own["verifier"]["num_gpus"] == 0.1 and own["scorer"]["num_cpus"] == 2.0
    with pytest.raises(Exception, match="ray.pool.captioners: no such pool"):
        pool_plan(_cfg(1, **{"pool.captioners.actors": 2}), one_gpu)


def test_gpu_memory_counts_each_model_at_its_load_precision_and_is_checked_per_pool():
    """IFCap's GPT-2 at precision=auto loads in fp32 (adjcap.models.ifcap), so the plan counts it at 4
    bytes; a pool whose models cannot fit on the GPUs is refused before Ray starts, naming the pool."""
    auto = load_config("headline", ["paths.data_dir=/nonexistent", "precision=auto", "captioner.precision=auto",
                                    "captioner.clip.precision=auto"]).resolved()
    vit_b = sum(budget.CLIP_TOWERS["ViT-B-32"].values())
    assert pools.pool_budget(auto, gpu=True)["captioner"]["bytes"] == 4 * budget.IFCAP_PARAMS + 2 * vit_b
    cfg = load_config("headline", ["paths.data_dir=/nonexistent", "ray.mps=true"]).resolved()  # fp32: bigG's image tower 6.9 GiB
    l4 = {"CPU": 16.0, "GPU": 1.0, "memory": 100 * GiB, "gpu_memory": 22.5 * GiB}
    assert set(pool_plan(cfg, l4)) == set(pools.pool_names())  # 14.0 GiB of models on one 22.5 GiB L4
    with pytest.raises(ResourceError) as e:
        pool_plan(cfg, {**l4, "gpu_memory": 6 * GiB})
    assert "\n" not in str(e.value) and "pool retriever: one actor's models take 6.9 GiB" in str(e.value)
    two = load_config("headline", ["paths.data_dir=/nonexistent", "ray.workers=2", "ray.gpu_share=0.125", "ray.mps=true"]).resolved()
    with pytest.raises(ResourceError, match=r"2 x retriever 6.9 GiB .* = 28.0 GiB of GPU memory, the 1 GPU\(s\) have 22.5 GiB"):
        pool_plan(two, l4)
    bf16 = load_config("headline", ["paths.data_dir=/nonexistent", "ray.workers=2", "ray.gpu_share=0.125",
                                    "precision=bf16", "ray.mps=true"]).resolved()
    assert pool_plan(bf16, l4)  # half the bytes: fits


def test_batch_sizes_are_data_and_blocks_hold_whole_batches():
    """Each pool's Ray Data batch: ray.pool.<pool>.batch_size, else ray.batch_size, else 64 images with
    GPUs and 16 without; a block holds whole batches of every pool (a multiple of their least common
    multiple), at most 4 of them, and there are at least twice as many blocks as tasks at once."""
    from adjcap.engine.executor import BLOCK_BATCHES, block_rows

    cfg = load_config("headline", ["paths.data_dir=/nonexistent", "ray.pool.captioner.batch_size=32"])
    assert pools.batch_size(cfg, "retriever", gpu=True) == 64 and pools.batch_size(cfg, None, gpu=False) == 16
    assert pools.batch_size(cfg, "captioner", gpu=False) == 32
    assert pools.batch_size(load_config("demo"), "verifier", gpu=True) == 8  # the demo preset's ray.batch_size
    assert block_rows(3000, 16, 2) == BLOCK_BATCHES * 16  # 47 blocks of 64: no block of 50 split 16, 16, 16, 2
    assert block_rows(200, 16, 4) == 16 and block_rows(10, 16, 4) == 16
    assert block_rows(3000, 48, 8) == 3 * 48 and all(block_rows(n, 24, 3) % 24 == 0 for n in (1, 100, 10_000))


def test_a_local_job_is_planned_as_the_models_it_loads_once(monkeypatch):
    """``executor = local`` loads each model once in its own process: its memory preflight plans one fused set,
    not the ``--workers`` actors a Ray job would start (which it refuses on the same machine)."""
    from adjcap.jobs import preflight

    monkeypatch.setattr(preflight, "local_cluster", lambda: {"CPU": 16.0, "GPU": 0.0, "memory": 20 * GiB})
    monkeypatch.delenv("RAY_ADDRESS", raising=False)

    def cfg(*sets):
        return load_config("headline", ["paths.data_dir=/nonexistent", *sets]).resolved()

    assert preflight.memory_problem(cfg()) is None  # one fused set: 16.2 GiB of 20
    assert "memory" in preflight.memory_problem(cfg("ray.workers=2"))  # two sets do not fit
    assert preflight.memory_problem(cfg("ray.workers=2", "executor=local")) is None
    assert preflight.memory_problem(cfg("ray.workers=8", "ray.pools=split", "executor=local")) is None
    monkeypatch.setattr(preflight, "local_cluster", lambda: {"CPU": 16.0, "GPU": 0.0, "memory": 8 * GiB})
    assert preflight.memory_problem(cfg("executor=local")).startswith("executor=local holds every model once")

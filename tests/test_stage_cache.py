"""Stage sharing: per-stage outputs identified by their settings and inputs, stored in the cache and
reused by configurations that agree up to a stage (the demo world, tiny models, in process)."""

import shutil

import pyarrow.parquet as pq
import pytest

from adjcap.config import load_config
from adjcap.engine.features import rows_to_table
from adjcap.index import benchmark_corpus
from adjcap.engine.pipeline import load_models, run_pipeline
from adjcap.engine.stage_cache import StageCache, stage_identities
from adjcap.engine.stage_registry import names as stage_names
from adjcap.engine.run_plan import read_records

STAGES = stage_names()


def _cfg(demo_cfg, cache_dir, *sets):
    base = [f"paths.cache_dir={cache_dir}", f"paths.runs_dir={cache_dir}/runs", "captioner.beam_width=4"]
    cfg = load_config("demo", base + list(sets)).resolved()
    return cfg


@pytest.fixture(scope="module")
def world(demo_cfg, tmp_path_factory):
    """A stage cache of its own next to the shared demo world (the tiny models and data are read from
    the demo cache by path)."""
    demo = demo_cfg.resolved()
    own = tmp_path_factory.mktemp("stage-cache")
    for sub in ("demo", "tiny"):
        src = f"{demo.paths.cache_dir}/{sub}"
        (own / sub).symlink_to(src, target_is_directory=True)
    cfg = _cfg(demo_cfg, own)
    corpus = benchmark_corpus(cfg.benchmark_cfg(), cfg.benchmark)
    return own, corpus.fingerprint, load_models(cfg), read_records(cfg)["test"][:4]


def _ids(cfg, fp):
    return stage_identities(cfg, fp)


def test_identities_follow_the_stage_chain(demo_cfg, world, tmp_path):
    own, fp, _, _ = world
    base = _ids(_cfg(demo_cfg, own), fp)
    assert set(base) == set(STAGES) and len(set(base.values())) == 4
    # speed-only settings and everything after extraction change nothing
    for same in (["ray.batch_size=3", "verifier.batch_size=2", "captioner.batch_size=5", "scorer.batch_size=7"],
                 ["rerank.picker=lm", "rerank.protocol=transductive", "rerank.alpha=0.3", "rerank.beta=0.1"],
                 ["scorer.lm_feature=sum", "eval.spice=true", "ray.workers=3", "limit=2", "name=other"]):
        assert _ids(_cfg(demo_cfg, own, *same), fp) == base, same
    # the captioner's beam: retrieval and verification shared, captioning and scoring not
    beam = _ids(_cfg(demo_cfg, own, "captioner.beam_width=3"), fp)
    assert [beam[s] == base[s] for s in STAGES] == [True, True, False, False]
    # the verifier: verification and everything after it
    for change in ("verifier.keep=4", "verifier.max_text_tokens=20", "verifier.enabled=false"):
        v = _ids(_cfg(demo_cfg, own, change), fp)
        assert [v[s] == base[s] for s in STAGES] == [True, False, False, False], change
    # retrieval: L, or another corpus
    assert all(a != b for a, b in zip(_ids(_cfg(demo_cfg, own, "retrieval.top_l=7"), fp).values(), base.values()))
    assert _ids(_cfg(demo_cfg, own), "other-corpus")["retrieve"] != base["retrieve"]


def test_a_local_checkpoint_counts_by_content_not_path(demo_cfg, world, tmp_path):
    own, fp, _, _ = world
    cfg = _cfg(demo_cfg, own)
    base = _ids(cfg, fp)
    copy = tmp_path / "elsewhere" / "tiny-ifcap.pt"
    copy.parent.mkdir()
    shutil.copyfile(cfg.captioner.checkpoint, copy)
    assert _ids(_cfg(demo_cfg, own, f"captioner.checkpoint={copy}"), fp) == base
    with open(copy, "r+b") as f:  # same size, other bytes
        b = f.read(1)
        f.seek(0)
        f.write(bytes([b[0] ^ 0xFF]))
    changed = _ids(_cfg(demo_cfg, own, f"captioner.checkpoint={copy}"), fp)
    assert [changed[s] == base[s] for s in STAGES] == [True, True, False, False]


def _run(cfg, world, share=True):
    _, fp, models, records = world
    if not cfg.verifier.enabled:  # the models as load_models gives them for this config
        models = type(models)(**{**vars(models), "verifier": None})
    counts: dict[str, int] = {}
    cache = StageCache.for_config(cfg, fp) if share else None
    rows = run_pipeline(records, cfg, models, stage_cache=cache, counts=counts)
    assert all(r["error"] is None for r in rows)
    return rows_to_table(rows).to_pylist(), counts


def test_rows_differing_in_beam_width_share_retrieval_and_verification(demo_cfg, world):
    own, fp, _, records = world
    n = len(records)
    wide, c1 = _run(_cfg(demo_cfg, own), world)
    assert c1 == {s: n for s in STAGES}  # a cold cache computes everything
    narrow, c2 = _run(_cfg(demo_cfg, own, "captioner.beam_width=3"), world)
    assert c2 == {"retrieve": 0, "verify": 0, "caption": n, "score": n}
    for a, b in zip(wide, narrow):
        assert a["retrieved"] == b["retrieved"] and a["verified"] == b["verified"]
        assert len(a["candidates"]) == 4 and len(b["candidates"]) == 3
    # the same rows as computing the narrow beam from scratch, without the cache
    fresh, c3 = _run(_cfg(demo_cfg, own, "captioner.beam_width=3"), world, share=False)
    assert c3 == {s: n for s in STAGES}
    for f, w in zip(fresh, narrow):
        diff = {k: (f[k], w[k]) for k in f if f[k] != w[k]}
        assert not diff, diff
    # a third run with the same settings computes nothing and gives the same rows
    again, c4 = _run(_cfg(demo_cfg, own, "captioner.beam_width=3"), world)
    assert c4 == {s: 0 for s in STAGES} and again == narrow


def test_changing_the_verifier_recomputes_verification_and_after(demo_cfg, world):
    own, fp, _, records = world
    n = len(records)
    base, _ = _run(_cfg(demo_cfg, own), world)
    other, counts = _run(_cfg(demo_cfg, own, "verifier.keep=3"), world)
    assert counts == {"retrieve": 0, "verify": n, "caption": n, "score": n}
    for a, b in zip(base, other):
        assert [r["cosine"] for r in a["retrieved"]] == [r["cosine"] for r in b["retrieved"]]
        assert len(a["verified"]) == demo_cfg.verifier.keep and len(b["verified"]) == 3
    # without a verifier: the stored retrieval (no verifier scores in it) is reused as is
    nover, counts = _run(_cfg(demo_cfg, own, "verifier.enabled=false"), world)
    assert counts == {"retrieve": 0, "verify": n, "caption": n, "score": n}
    assert all(r["verifier"] != r["verifier"] for row in nover for r in row["retrieved"])  # NaN


def test_stored_parts_are_complete_files_and_unreadable_ones_are_set_aside(demo_cfg, world, capsys):
    own, fp, _, records = world
    cfg = _cfg(demo_cfg, own, "captioner.beam_width=2")
    _run(cfg, world)
    cache = StageCache.for_config(cfg, fp)
    parts = cache.parts("score")
    assert parts and all(pq.read_table(p).num_rows for p in parts)
    assert (cache.stage_dir("caption") / "identity.json").exists()
    parts[0].write_bytes(b"not parquet")
    _, counts = _run(cfg, world)
    assert counts == {"retrieve": 0, "verify": 0, "caption": 0, "score": len(records)}
    assert "unreadable" in capsys.readouterr().err
    assert list(cache.stage_dir("score").glob("*.corrupt"))


def _encode_other_corpus(cfg, models, tmp_path):
    """Another corpus (the demo captions, reordered and reworded) encoded with the demo encoder through
    the real encode path; returns its index directory."""
    from adjcap.data.corpus import load_corpus
    from adjcap.index import encode_shards_in_process, ensure_index

    demo = benchmark_corpus(cfg.benchmark_cfg(), cfg.benchmark)
    lines = tmp_path / "other-corpus.txt"
    lines.write_text("\n".join(f"a photo of {t.lower()}" for t in reversed(demo.texts[:300])) + "\n")
    other = load_corpus(lines, "lines")
    ocfg = _cfg(None, cfg.paths.cache_dir, f"benchmarks.demo.corpus={lines}", "benchmarks.demo.corpus_format=lines",
                f"retrieval.index_dir={tmp_path / 'other-index'}")
    return ensure_index(ocfg.retrieval, ocfg.paths.cache_dir, other, encode_shards_in_process(models.retrieval),
                        corpus_format="lines"), other


def test_another_index_is_searched_again_and_a_moved_one_is_not(demo_cfg, world, tmp_path):
    from adjcap.engine.identity import run_identity
    from adjcap.index.lifecycle import search_corpus

    def identity(c):  # as a job's run plan computes it: the corpus the run searches, read once
        return run_identity(c, search_corpus(c.retrieval, c.benchmark_cfg(), c.benchmark, c.paths.cache_dir).fingerprint)

    own, fp, models, records = world
    n = len(records)
    base_cfg = _cfg(demo_cfg, own)
    base, _ = _run(base_cfg, world)  # the demo index's outputs are in the cache
    index, other = _encode_other_corpus(base_cfg, models, tmp_path)
    cfg = _cfg(demo_cfg, own, f"retrieval.index_dir={index}")
    run_models = load_models(cfg)
    assert list(run_models.index.texts) == other.texts  # the index's own corpus, from its manifest
    world2 = (own, other.fingerprint, run_models, records)
    rows, counts = _run(cfg, world2)
    assert counts == {s: n for s in STAGES}  # nothing reused from the demo index's outputs
    got = {t for r in rows for t in (x["text"] for x in r["retrieved"])}
    assert got <= set(other.texts) and not got & {t for r in base for t in (x["text"] for x in r["retrieved"])}
    assert identity(cfg) != identity(base_cfg)  # resume into a run directory refuses it too
    # the same index under another path: the same identity, everything reused
    moved = tmp_path / "moved-index"
    shutil.copytree(index, moved)
    mcfg = _cfg(demo_cfg, own, f"retrieval.index_dir={moved}")
    again, counts = _run(mcfg, world2)
    assert counts == {s: 0 for s in STAGES} and again == rows
    assert identity(mcfg) == identity(cfg)


def test_an_index_of_another_encoder_is_refused_not_relabelled(demo_cfg, world, tmp_path):
    from adjcap.index import CaptionIndexError, IndexManifest, encode_shards_in_process, ensure_index

    own, fp, models, _ = world
    index, other = _encode_other_corpus(_cfg(demo_cfg, own), models, tmp_path)
    cfg = _cfg(demo_cfg, own, f"retrieval.index_dir={index}", "retrieval.encoder.model=adjcap-tiny-clip")
    with pytest.raises(CaptionIndexError, match=r"retrieval.index_dir=.*encoded with adjcap-tiny-clip-large.*retrieval.encoder"):
        ensure_index(cfg.retrieval, cfg.paths.cache_dir, other, encode_shards_in_process(models.retrieval))
    assert IndexManifest.read(index).encoder_id.startswith("adjcap-tiny-clip-large")

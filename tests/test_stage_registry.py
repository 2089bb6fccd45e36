"""The stage registry is the only list of stages and model families (docs/architecture.md, "The stage
registry"): a toy family and a toy stage registered here, in the test, run through the in-process
pipeline, the identities and the stage cache, and show up in the pools, their memory plan and the
job's progress, with nothing else edited. The four stages' identities keep their values."""

import pyarrow as pa
import pytest

from adjcap.engine import pools, stage_registry
from adjcap.engine.cluster_plan import PoolPlan
from adjcap.config import load_config
from adjcap.engine.features import rows_to_table
from adjcap.index import benchmark_corpus
from adjcap.engine.pipeline import load_models, run_pipeline
from adjcap.engine import transport
from adjcap.engine.image_state import ImageState
from adjcap.engine.stage_cache import StageCache, apply_outputs, stage_identities
from adjcap.engine.stage_registry import Family, Reads, Stage, StageOutput
from adjcap.jobs.extract_features import stream_stages
from adjcap.engine.run_plan import read_records

LOADS: list[str] = []  # the toy family's loads, in this process


class WordCounter:
    """The toy "model": words per caption."""

    def __call__(self, text: str) -> int:
        return len(text.split())


def _load_counter(cfg, loading):
    LOADS.append(cfg.name)
    return WordCounter()


def _count(states, models, cfg):
    """The toy stage's batch function: words of every beam candidate (skips images that have it)."""
    counter = models["words"]
    for s in states:
        if s.ok and "count" not in s.done:
            s.extra["count"] = [counter(c["text"]) for c in s.candidates]
            s.done.add("count")
            s.computed.add("count")


WORDS = Family("words", _load_counter, lambda cfg, gpu, holds: (1000, 4000), lambda cfg: ())  # reads no image
COUNT = Stage(
    "count", "counter", ("words",),
    Reads(("seed",)),  # a setting no other stage reads: it changes this stage's identity only
    StageOutput(pa.schema([("image_id", pa.string()), ("n_words", pa.list_(pa.int32()))]),
                lambda s: {"n_words": s.extra["count"]},
                lambda s, o: s.extra.__setitem__("count", list(o["n_words"]))),
    _count,
)


@pytest.fixture(scope="module")
def world(demo_cfg, tmp_path_factory):
    own = tmp_path_factory.mktemp("toy-stage")
    for sub in ("demo", "tiny"):
        (own / sub).symlink_to(f"{demo_cfg.resolved().paths.cache_dir}/{sub}", target_is_directory=True)
    sets = [f"paths.cache_dir={own}", f"paths.runs_dir={own}/runs", "captioner.beam_width=3"]
    cfg = load_config("demo", sets).resolved()
    fp = benchmark_corpus(cfg.benchmark_cfg(), cfg.benchmark).fingerprint
    return cfg, sets, fp, read_records(cfg)["test"][:3]


def test_a_toy_stage_runs_through_pipeline_identity_and_cache(world):
    cfg, sets, fp, records = world
    four = stage_identities(cfg, fp)
    with stage_registry.registered(WORDS, COUNT):
        assert stage_registry.names() == ("retrieve", "verify", "caption", "score", "count")
        # identity: the toy stage's covers its parent's; the four keep their values
        ids = stage_identities(cfg, fp)
        assert {s: ids[s] for s in four} == four and ids["count"] not in four.values()
        other = stage_identities(load_config("demo", [*sets, "seed=7"]).resolved(), fp)
        assert {s: other[s] for s in four} == four and other["count"] != ids["count"]
        # the in-process pipeline loads the toy family once and runs the toy stage after the four
        LOADS.clear()
        models = load_models(cfg)
        assert LOADS == [cfg.name] and isinstance(models.words, WordCounter)
        cache = StageCache.for_config(cfg, fp)
        counts: dict[str, int] = {}
        rows = run_pipeline(records, cfg, models, stage_cache=cache, counts=counts)
        n = len(records)
        assert all(r["error"] is None for r in rows)
        assert counts == {"retrieve": n, "verify": n, "caption": n, "score": n, "count": n}
        # the stage cache stored the toy stage's columns under its own identity
        assert cache.parts("count") and cache.stage_dir("count").name == ids["count"]
        found = cache.lookup(r.image_id for r in records)
        for row in rows:
            assert found[row["image_id"]]["count"]["n_words"] == [len(c["text"].split()) for c in row["candidates"]]
        # between Ray pools the toy stage's output travels as its declared column
        assert transport.schema().field("n_words").type == pa.list_(pa.int32())
        done = [apply_outputs(ImageState(r.image_id, cfg.benchmark, r.split), found[r.image_id]) for r in records]
        back = transport.unpack(transport.pack(done))
        assert [b.extra["count"] for b in back] == [found[r.image_id]["count"]["n_words"] for r in records]
        # a rerun reuses all five stages; another seed recomputes only the toy stage
        again: dict[str, int] = {}
        reused = run_pipeline(records, cfg, models, stage_cache=StageCache.for_config(cfg, fp), counts=again)
        assert rows_to_table(reused).to_pylist() == rows_to_table(rows).to_pylist()  # as stored: float32
        assert again == {s: 0 for s in stage_registry.names()}
        seeded = load_config("demo", [*sets, "seed=7"]).resolved()
        third: dict[str, int] = {}
        run_pipeline(records, seeded, models, stage_cache=StageCache.for_config(seeded, fp), counts=third)
        assert third == {"retrieve": 0, "verify": 0, "caption": 0, "score": 0, "count": n}
        # pools: a split pool of its own, in the fused pool, in the memory plan and the job's progress
        assert pools.pool_names() == ("retriever", "verifier", "captioner", "scorer", "counter")
        assert pools.layout(cfg, gpu=False)[0].families[-1] == "words"
        budget = pools.pool_budget(cfg, gpu=False)
        assert budget["counter"] == {"params": 1000, "bytes": 4000}
        assert budget["fused"]["params"] > 1000
        assert stream_stages(PoolPlan.of(cfg), 0) == ["decode", "retrieve", "verify", "caption", "score", "count"]
    assert stage_registry.names() == ("retrieve", "verify", "caption", "score")
    assert stage_identities(cfg, fp) == four


def test_registering_twice_or_without_the_family_is_refused():
    with pytest.raises(ValueError, match="stage 'count' needs families \\['words'\\]"):
        stage_registry.register(COUNT)
    with pytest.raises(ValueError, match="stage 'retrieve' is registered already"):
        stage_registry.register(stage_registry.stage("retrieve"))
    assert stage_registry.names() == ("retrieve", "verify", "caption", "score")


def test_a_family_that_says_no_pixels_is_refused():
    """``Family.pixels`` is required: a family that does not say what its models read of the image would
    get no image (every image failing in its pool); it is refused when built or registered."""
    with pytest.raises(TypeError, match="pixels"):
        Family("words", _load_counter, lambda cfg, gpu, holds: (0, 0))
    with pytest.raises(ValueError, match="family 'words' says no pixels"):
        stage_registry.register(Family("words", _load_counter, lambda cfg, gpu, holds: (0, 0), None))
    with pytest.raises(KeyError, match="no model family 'words'"):
        stage_registry.family("words")


def test_the_mechanism_knows_no_stage():
    """The records and lookups (adjcap.engine.stage_records) import no built-in entry: the four stages and five
    families are registered by adjcap.engine.stage_registry alone, on import, and are the mechanism's table."""
    import ast
    from pathlib import Path

    from adjcap.engine import stage_records

    tree = ast.parse(Path(stage_records.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | \
        {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    # the image state it carries, the config it types, the TF32 switch its loading sets: no stage, family or model
    assert {m for m in imported if m and m.startswith("adjcap")} == \
        {"adjcap.engine.image_state", "adjcap.config", "adjcap.models.precision"}
    assert stage_records.stages() == stage_registry.stages() and stage_records.names() == stage_registry.names()
    assert [stage_records.family(f).name for f in ("retrieval", "index", "verifier", "captioner", "scorer")] == \
        ["retrieval", "index", "verifier", "captioner", "scorer"]

"""What a pool's last actor writes for a batch (adjcap.engine.batch_sink): one feature part per split and one
stage-cache part per computed stage, named for the batch's content, so a batch written again (a
retried task, a restarted actor) replaces its own parts and no image is stored twice."""

import pyarrow as pa
import pyarrow.parquet as pq

from adjcap.engine.batch_sink import Sink, count_done, done_columns, write_batch
from adjcap.engine.image_state import ImageState
from adjcap.storage.parts import content_part_name
from adjcap.storage.rundir import RunDir
from adjcap.engine.stage_cache import StageCache
from adjcap.engine.stage_registry import names as stage_names


def _states(ids, split="test"):
    out = []
    for i in ids:
        s = ImageState(image_id=i, benchmark="demo", split=split)
        s.candidates = [{"text": f"caption {i}", "verifier": 0.5}]
        s.computed.add("score")
        out.append(s)
    return out


def test_part_names_follow_content_not_order():
    assert content_part_name("k", ["b", "a"]) == content_part_name("k", ["a", "b"])
    assert content_part_name("k", ["a"]) != content_part_name("k", ["a", "b"])
    assert content_part_name("k", ["a"]) != content_part_name("other run", ["a"])


def test_a_batch_written_twice_replaces_its_own_parts(tmp_path):
    run = RunDir(tmp_path / "run")
    ids = {stage: f"id-{stage}" for stage in stage_names()}
    cache = StageCache(tmp_path / "stages", ids)
    sink = Sink(str(run.path), "demo", "run identity", str(cache.root), ids)
    batch = _states(["a", "b"]) + _states(["c"], split="val")
    batch[1].error = "decode: broken"  # a failed image: a feature row, no stage-cache entry
    for _ in range(2):  # the same batch computed again
        write_batch(batch, sink, sink.cache())
    assert len(run.parts("demo", "test")) == len(run.parts("demo", "val")) == 1
    assert sorted(run.done_ids("demo", "test")) == ["a", "b"] and run.done_ids("demo", "val") == {"c"}
    rows = {r["image_id"]: r for r in run.read_features("demo", "test").to_pylist()}
    assert rows["b"]["error"] == "decode: broken" and rows["a"]["candidates"][0]["text"] == "caption a"
    stored = cache.parts("score")
    assert len(stored) == 1 and sorted(pq.read_table(stored[0]).column("image_id").to_pylist()) == ["a", "c"]
    assert not cache.parts("retrieve")  # only the stages the batch computed
    write_batch(_states(["d"]), sink)  # another batch: another part, no stage cache without one
    assert len(run.parts("demo", "test")) == 2 and len(cache.parts("score")) == 1


def test_the_driver_gets_small_columns_only():
    s = _states(["a", "b"])
    s[0].computed.add("caption")
    s[1].error = "decode: broken"
    cols = done_columns(s)
    assert cols == {"image_id": ["a", "b"], "split": ["test", "test"], "failed": [False, True],
                    "error": [None, "decode: broken"],  # a failed image's one line (adjcap.jobs.failures)
                    "computed": [["caption", "score"], ["score"]]}
    summary = {"test": {"done": 0, "failed": 0}, "val": {"done": 0, "failed": 0}}
    computed = {"caption": 0, "score": 0}
    count_done(pa.table(cols), summary, computed)
    count_done(pa.table(done_columns(_states(["c"]))), summary, computed)
    assert summary == {"test": {"done": 2, "failed": 1}, "val": {"done": 0, "failed": 0}}
    assert computed == {"caption": 1, "score": 3}

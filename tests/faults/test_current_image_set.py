"""A rerun with a smaller --limit reuses the features already written, but evaluation (like the fit)
sees exactly the current image set: rows of images no longer in the run are ignored."""

from adjcap.engine.features import empty_row, rows_to_table
from adjcap.metrics.run_metrics import failed_image_ids, load_run_references
from adjcap.storage.rundir import RunDir


def test_evaluation_reads_only_the_current_image_set(tmp_path):
    run = RunDir(tmp_path / "run")
    rows = [empty_row(f"i{k}", "demo", "test", None, "decode: truncated" if k == 3 else None) for k in range(4)]
    run.write_part("demo", "test", rows_to_table(rows))
    # the last run read two of the four images (a smaller --limit)
    run.write_references("demo", "test", {"i0": ["a dog"], "i1": ["a cat"]})
    refs, _, feats = load_run_references(run)
    assert set(refs) == {"i0", "i1"}
    assert sorted(feats.column("image_id").to_pylist()) == ["i0", "i1"]
    assert failed_image_ids(feats, refs) == set()  # i3 failed once, but is not in this run any more

"""Shared data for the fault-injection tests: a few real COCO images' references and predictions
from tests/fixtures/metrics, written as COCO files."""

import json
from pathlib import Path

import pytest

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "metrics"


@pytest.fixture
def small_coco(tmp_path):
    """(predictions path, references path, {image_id: caption}) for 6 images in COCO format."""
    gt = json.loads((FIX / "coco_karpathy_test_gt_100.json").read_text())
    preds = json.loads((FIX / "viecap_coco_results_100.json").read_text())[:6]
    ids = {p["image_id"] for p in preds}
    refs = {"images": [i for i in gt["images"] if i["id"] in ids],
            "annotations": [a for a in gt["annotations"] if a["image_id"] in ids]}
    rp, pp = tmp_path / "refs.json", tmp_path / "preds.json"
    rp.write_text(json.dumps(refs))
    pp.write_text(json.dumps(preds))
    return pp, rp, {p["image_id"]: p["caption"] for p in preds}

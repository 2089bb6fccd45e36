"""CHAIR: the matcher rules and hand-checked examples, the paper's reference proxy and the original
instance-annotation CHAIR (a small hand-made COCO instances file, tests/fixtures/metrics)."""

import json

import pytest

from adjcap.metrics.chair import (ChairMatcher, chair, chair_proxy, load_instance_objects, load_vocabulary,
                                  parse_synonyms, plural_forms)
from adjcap.metrics.coco import MissingReferences

# (prediction, references) - hand-checked below
EXAMPLE = {
    "1": ("A man riding a motor bike next to two dogs.",
          ["A person on a motorcycle.", "A guy rides a motorbike down the road."]),
    "2": ("A teddy bear sitting on a toilet seat.",
          ["A stuffed bear on a toilet.", "A toy left in the bathroom."]),
    "3": ("Hot dogs and a glass of wine on a dining table.",
          ["A hot dog on a plate next to a table."]),
    "4": ("A baby elephant walks with an adult elephant near a passenger train.",
          ["Two elephants walking beside train tracks."]),
    "5": ("A cat sitting on a laptop keyboard.",
          ["A kitten lying on a computer."]),
    "6": ("A view of the mountains.",
          ["Snowy mountains under a blue sky."]),
    "7": ("The seat of the toilet is up and a sink is nearby",
          ["A bathroom with a toilet and a sink."]),
}
# By hand (mentions -> reference classes -> hallucinated):
# 1: man->person, "motor bike"->motorcycle, dogs->dog | refs {person, motorcycle} | dog          (3 mentions, 1 hall.)
# 2: "teddy bear", "toilet seat"->toilet | refs "stuffed bear"->bear, toilet | teddy bear     (2, 1)
# 3: "hot dogs"->hot dog, "dining table" ("glass of wine" is no wine glass) | refs hot dog,
#    table->dining table | none                                                              (2, 0)
# 4: "baby elephant", "adult elephant" -> elephant x2 (no person), "passenger train"->train |
#    refs elephants; "train tracks" is no train | train                                       (3, 1)
# 5: cat, laptop, keyboard | refs kitten->cat, computer->laptop | keyboard                     (3, 1)
# 6: nothing                                                                                   (0, 0)
# 7: "seat" beside "toilet" is no chair; toilet, sink | refs toilet, sink | none              (2, 0)
# captions with a hallucination: 1, 2, 4, 5 -> CHAIR_s = 4/7 = 57.142857 %
# mentions 3+2+2+3+3+0+2 = 15, hallucinated 1+1+0+1+1+0+0 = 4 -> CHAIR_i = 4/15 = 26.666667 %


def test_hand_checked_example():
    preds = {k: v[0] for k, v in EXAMPLE.items()}
    refs = {k: v[1] for k, v in EXAMPLE.items()}
    r = chair_proxy(preds, refs)
    assert r.n_captions == 7
    assert r.n_captions_hallucinated == 4
    assert r.n_mentioned == 15
    assert r.n_hallucinated == 4
    assert r.chair_s == pytest.approx(100 * 4 / 7)
    assert r.chair_i == pytest.approx(100 * 4 / 15)
    assert r.per_class == {
        "person": {"mentioned": 1, "hallucinated": 0},
        "motorcycle": {"mentioned": 1, "hallucinated": 0},
        "train": {"mentioned": 1, "hallucinated": 1},
        "elephant": {"mentioned": 2, "hallucinated": 0},
        "dog": {"mentioned": 1, "hallucinated": 1},
        "cat": {"mentioned": 1, "hallucinated": 0},
        "hot dog": {"mentioned": 1, "hallucinated": 0},
        "dining table": {"mentioned": 1, "hallucinated": 0},
        "toilet": {"mentioned": 2, "hallucinated": 0},
        "laptop": {"mentioned": 1, "hallucinated": 0},
        "keyboard": {"mentioned": 1, "hallucinated": 1},
        "sink": {"mentioned": 1, "hallucinated": 0},
        "teddy bear": {"mentioned": 1, "hallucinated": 1},
    }
    assert list(r.per_class)[:3] == ["person", "motorcycle", "train"]  # COCO category order
    assert r.per_image["4"] == {"mentioned": ["elephant", "elephant", "train"], "hallucinated": ["train"],
                                "objects": ["elephant"]}
    # recall: the references' classes (2+2+2+1+2+0+2 = 11) the captions mention; image 2's "teddy bear"
    # is not the references' "bear", so 10 of 11
    assert (r.n_objects, r.n_recalled) == (11, 10) and r.recall == pytest.approx(100 * 10 / 11)
    d = r.to_dict()
    assert d["CHAIR_s"] == pytest.approx(57.142857, abs=1e-5) and "per_image" not in d


def test_vocabulary_is_the_80_coco_classes():
    v = load_vocabulary()
    assert len(v.classes) == 80
    assert v.classes[:5] == ("person", "bicycle", "car", "motorcycle", "airplane")
    assert v.classes[-3:] == ("teddy bear", "hair drier", "toothbrush")
    assert {"dining table", "tv", "skis", "sports ball", "cell phone"} <= set(v.classes)
    # quirks of the original list are normalised: duplicates, double spaces, case
    assert v.synonyms["bicycle"].count("bike") == 1
    assert "motor bike" in v.synonyms["motorcycle"]
    assert "iphone" in v.synonyms["cell phone"]


@pytest.mark.parametrize(
    "caption, expected",
    [
        ("Two policemen and three women with their children", ["person", "person", "person"]),
        ("Knives, forks and wine glasses", ["knife", "fork", "wine glass"]),
        ("two ponies and some puppies", ["horse", "dog"]),
        ("a skier on skis holding a ski pole", ["person", "skis", "skis"]),
        ("A pair of scissors and two mice", ["scissors", "mouse"]),
        ("Buses, benches and teddy bears", ["bus", "bench", "teddy bear"]),
        ("a stove top oven", ["oven"]),
        ("a baby giraffe and a baby", ["giraffe", "person"]),
        ("A man in a bow tie at home plate", ["person", "tie"]),
        ("passenger jets at the gate", ["airplane"]),
        ("An empty room.", []),
        # a hyphenated word is one token, as in the original CHAIR (NLTK's word_tokenize keeps it whole):
        # it names no object, even where its parts would
        ("hot-dog stand", []),
        ("a dog-like object on a yellow-orange table", ["dining table"]),
    ],
)
def test_matcher_rules(caption, expected):
    assert [m.cls for m in ChairMatcher().mentions(caption)] == expected


def test_plural_rules():
    assert {"buses", "busses"} <= plural_forms("bus")
    assert "ponies" in plural_forms("pony") and "guys" in plural_forms("guy")
    assert "knives" in plural_forms("knife") and "calves" in plural_forms("calf")
    assert "policemen" in plural_forms("policeman") and "people" in plural_forms("person")


def test_missing_references_and_bad_synonyms():
    with pytest.raises(MissingReferences):
        chair_proxy({"x": "a dog"}, {"y": ["a dog"]})
    r = chair_proxy({"x": "a dog"}, {"x": ["a dog"], "y": ["a cat"]}, on_missing="intersection")
    assert r.n_captions == 1 and r.chair_s == 0.0
    with pytest.raises(ValueError, match="appears twice"):
        parse_synonyms("dog, puppy\ndog, hound")


# A hand-made COCO instances file (written by the fixture below: tests/fixtures holds real data only) for
# three of the examples above, by COCO id: 101 <- "1", 102 <- "5", 103 <- "6". Its annotations, by hand:
# 101: person, motorcycle, dog        (the dog the references do not mention is in the image)
# 102: cat, laptop                     (no keyboard annotated)
# 103: none (a landscape), and image 104 of the file is not in the run
# Instance CHAIR of those three captions (ground truth = instances + references):
# "1": man->person, motor bike->motorcycle, dogs->dog | truth {person, motorcycle, dog} | none   (3, 0)
# "5": cat, laptop, keyboard | truth {cat, laptop} + refs {cat, laptop} | keyboard               (3, 1)
# "6": nothing                                                                                   (0, 0)
# -> CHAIR_s = 1/3 = 33.333 %, CHAIR_i = 1/6 = 16.667 %; the proxy on the same three: "1" hallucinates
#    dog, "5" keyboard -> CHAIR_s = 2/3, CHAIR_i = 2/6
COCO_IDS = {"1": 101, "5": 102, "6": 103}
INSTANCES = {  # the COCO instances format; ids and boxes invented, category ids and names COCO's
    "images": [{"id": i, "file_name": f"COCO_val2014_{i:012d}.jpg", "width": 640, "height": 480}
               for i in (101, 102, 103, 104)],
    "categories": [
        {"id": 1, "name": "person", "supercategory": "person"},
        {"id": 4, "name": "motorcycle", "supercategory": "vehicle"},
        {"id": 18, "name": "dog", "supercategory": "animal"},
        {"id": 17, "name": "cat", "supercategory": "animal"},
        {"id": 73, "name": "laptop", "supercategory": "electronic"},
        {"id": 76, "name": "keyboard", "supercategory": "electronic"},
    ],
    "annotations": [
        {"id": 1, "image_id": 101, "category_id": 1, "bbox": [10, 10, 50, 100], "area": 5000, "iscrowd": 0},
        {"id": 2, "image_id": 101, "category_id": 4, "bbox": [60, 80, 200, 120], "area": 24000, "iscrowd": 0},
        {"id": 3, "image_id": 101, "category_id": 18, "bbox": [300, 300, 60, 40], "area": 2400, "iscrowd": 0},
        {"id": 4, "image_id": 101, "category_id": 18, "bbox": [380, 300, 60, 40], "area": 2400, "iscrowd": 0},
        {"id": 5, "image_id": 102, "category_id": 17, "bbox": [100, 100, 200, 150], "area": 30000, "iscrowd": 0},
        {"id": 6, "image_id": 102, "category_id": 73, "bbox": [50, 200, 300, 200], "area": 60000, "iscrowd": 0},
        {"id": 7, "image_id": 104, "category_id": 76, "bbox": [0, 0, 10, 10], "area": 100, "iscrowd": 0},
    ],
}


@pytest.fixture
def instances_file(tmp_path):
    p = tmp_path / "chair_instances.json"
    p.write_text(json.dumps(INSTANCES))
    return p


def test_instance_chair_hand_checked(instances_file):
    preds = {k: EXAMPLE[k][0] for k in COCO_IDS}
    refs = {k: EXAMPLE[k][1] for k in COCO_IDS}
    objects = load_instance_objects([instances_file], COCO_IDS)
    assert objects == {"1": {"person", "motorcycle", "dog"}, "5": {"cat", "laptop"}, "6": set()}
    r = chair(preds, refs, objects=objects)
    assert (r.n_captions, r.n_captions_hallucinated, r.n_mentioned, r.n_hallucinated) == (3, 1, 6, 1)
    assert r.chair_s == pytest.approx(100 / 3) and r.chair_i == pytest.approx(100 / 6)
    assert r.per_image["1"]["hallucinated"] == [] and r.per_image["5"]["hallucinated"] == ["keyboard"]
    assert r.to_dict()["ground_truth"] == "instances"
    p = chair_proxy(preds, refs)
    assert (p.n_captions_hallucinated, p.n_hallucinated, p.to_dict()["ground_truth"]) == (2, 2, "proxy")


def test_instance_files_refuse_what_they_cannot_answer(instances_file, tmp_path):
    with pytest.raises(ValueError, match="none of the 1 images is in .*chair_instances.json.*COCO id 999"):
        load_instance_objects([instances_file], {"x": 999})
    with pytest.raises(FileNotFoundError, match="adjcap prepare coco-instances"):
        load_instance_objects([tmp_path / "instances_val2014.json"])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"images": []}))
    with pytest.raises(ValueError, match="bad.json: not a COCO instances file"):
        load_instance_objects([bad])


def _instances(tmp_path, name="edited.json", **edits):
    data = json.loads(json.dumps(INSTANCES))
    for key, extra in edits.items():
        data[key] = data[key] + extra
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return p


def test_an_image_no_instances_file_has_is_scored_against_its_references(instances_file):
    """The original CHAIR's rule (its objects start from the captions): image "7" (COCO id 107, in no
    file) keeps its references' objects; counted and said, not refused."""
    ids = {**COCO_IDS, "7": 107}
    objects = load_instance_objects([instances_file], ids)
    assert "7" not in objects and objects["6"] == set()
    preds = {**{k: EXAMPLE[k][0] for k in COCO_IDS}, "7": "a dog and a cat."}
    refs = {**{k: EXAMPLE[k][1] for k in COCO_IDS}, "7": ["a dog on a sofa."]}
    r = chair(preds, refs, objects=objects)
    assert r.per_image["7"] == {"mentioned": ["dog", "cat"], "hallucinated": ["cat"], "objects": ["couch", "dog"]}
    assert (r.n_without_instances, r.to_dict()["n_without_instances"]) == (1, 1)
    assert (r.n_mentioned, r.n_hallucinated) == (8, 2)  # the hand-checked three plus image 7's


def test_a_string_image_id_is_ignored_as_the_original_chair_ignores_it(tmp_path, caplog):
    p = _instances(tmp_path, annotations=[{"id": 8, "image_id": "103", "category_id": 18, "bbox": [0, 0, 5, 5]}])
    with caplog.at_level("WARNING", logger="adjcap.metrics.chair"):
        objects = load_instance_objects([p], COCO_IDS)
    assert objects["6"] == set()  # image 103 keeps no dog: "103" is not the integer 103
    said = [r.getMessage() for r in caplog.records if r.name == "adjcap.metrics.chair"]
    assert len(said) == 1 and f"{p}: 1 annotation(s) with a non-integer image_id ignored" in said[0]


@pytest.mark.parametrize("edits, words", [
    (dict(annotations=[{"id": 8, "image_id": 103, "category_id": 12}]),
     "annotations[7] (image 103) has category_id 12, which no category of the file has (its category ids: 1..76)"),
    (dict(annotations=[{"id": 8, "image_id": 103, "category_id": "18"}]), "has category_id '18', which no category"),
    (dict(categories=[{"id": 91, "name": "hair brush"}], annotations=[{"id": 8, "image_id": 103, "category_id": 91}]),
     "categories 'hair brush' (1 in all) are not CHAIR classes"),
    (dict(categories=[{"id": "92", "name": "dog"}]), "categories[6] is not {\"id\": integer"),
])
def test_a_bad_instances_file_is_one_line_naming_it(tmp_path, edits, words):
    p = _instances(tmp_path, **edits)
    with pytest.raises(ValueError) as e:
        load_instance_objects([p], COCO_IDS)
    assert str(e.value).startswith(f"{p}: ") and words in str(e.value) and "\n" not in str(e.value), str(e.value)
    assert "KeyError" not in str(e.value)


def test_evaluate_predictions_honours_eval_chair_and_checks_the_files_before_any_metric(tmp_path, monkeypatch):
    """`adjcap evaluate --predictions P --references R --set eval.chair=instances`: the instance objects
    reach the evaluator; a bad instances file is refused (naming it) before any metric runs."""
    from typer.testing import CliRunner

    from adjcap.cli import app
    from adjcap.metrics import evaluate as ev_mod

    refs = tmp_path / "captions.json"
    refs.write_text(json.dumps({
        "images": [{"id": c, "file_name": f"COCO_val2014_{c:012d}.jpg"} for c in COCO_IDS.values()],
        "annotations": [{"id": k, "image_id": c, "caption": cap} for k, (i, c) in enumerate(COCO_IDS.items())
                        for cap in EXAMPLE[i][1]]}))
    preds = tmp_path / "preds.json"
    preds.write_text(json.dumps([{"image_id": c, "caption": EXAMPLE[i][0]} for i, c in COCO_IDS.items()]))
    seen = {}

    class Recorder(ev_mod.Evaluator):
        def score(self, predictions, **kw):
            seen.update(objects=self.instance_objects, ground_truth=self.chair_ground_truth)
            raise RuntimeError("recorded")

    monkeypatch.setattr(ev_mod, "Evaluator", Recorder)

    def run(instances):
        return CliRunner().invoke(app, ["evaluate", "--predictions", str(preds), "--references", str(refs),
                                        "--no-spice", "--set", "eval.chair=instances",
                                        "--set", f"eval.coco_instances=[\"{instances}\"]"])

    res = run(_instances(tmp_path, "good.json"))
    assert seen["ground_truth"] == "instances", res.output
    assert seen["objects"] == {f"COCO_val2014_{c:012d}.jpg": o for c, o in
                               ((101, {"person", "motorcycle", "dog"}), (102, {"cat", "laptop"}), (103, set()))}
    seen.clear()
    bad = _instances(tmp_path, "bad.json", annotations=[{"id": 8, "image_id": 103, "category_id": 12}])
    res = run(bad)
    assert res.exit_code != 0 and not seen and f"{bad}: annotations[7]" in res.output, res.output


def test_eval_chair_both_scores_the_proxy_and_the_instance_chair(instances_file, tmp_path):
    """eval.chair = both on a run directory whose references carry COCO ids: metrics["chair"] is the
    proxy and metrics["chair_instances"] the hand-checked instance CHAIR above; a benchmark without
    COCO ids says in one note that instance CHAIR is not available."""
    from adjcap.metrics.evaluate import Evaluator
    from adjcap.metrics.run_metrics import instance_ground_truth
    from adjcap.storage.rundir import RunDir

    run = RunDir(tmp_path / "run")
    refs = {k: EXAMPLE[k][1] for k in COCO_IDS}
    run.write_references("coco", "test", refs, coco_ids=COCO_IDS)
    objects, note = instance_ground_truth(run, refs, "both", [instances_file])
    assert note is None and objects == {"1": {"person", "motorcycle", "dog"}, "5": {"cat", "laptop"}, "6": set()}
    with Evaluator(refs, instance_objects=objects, chair_ground_truth="both") as ev:
        out = ev.score({k: EXAMPLE[k][0] for k in COCO_IDS})
    assert out["chair"]["ground_truth"] == "proxy" and out["chair"]["CHAIR_i"] == pytest.approx(100 * 2 / 6)
    inst = out["chair_instances"]
    assert inst["ground_truth"] == "instances"
    assert inst["CHAIR_s"] == pytest.approx(100 / 3) and inst["CHAIR_i"] == pytest.approx(100 / 6)
    other = RunDir(tmp_path / "nocaps")
    other.write_references("nocaps", "val", refs)
    objects, note = instance_ground_truth(other, refs, "instances", [instances_file])
    assert objects is None and note.startswith("instance CHAIR not available: 3 of 3 images have no COCO id")
    assert instance_ground_truth(run, refs, "proxy", [instances_file]) == (None, None)


def test_prepare_for_knows_the_instances_only_when_coco_scores_instance_chair():
    from adjcap.config import load_config
    from adjcap.machine.needs import needs_of

    def chair_needs(*sets):
        return [(n.what, n.step) for n in needs_of(load_config("headline", list(sets)).resolved(), ("chair",))]

    assert chair_needs() == []
    assert chair_needs("eval.chair=both") == [("COCO instances instances_val2014.json (instance CHAIR)", "coco-instances")]
    assert chair_needs("eval.chair=instances", "benchmark=nocaps") == []


def test_a_job_learns_of_a_bad_instances_file_before_ray(tmp_path):
    from adjcap.config import load_config
    from adjcap.jobs import preflight

    bad = _instances(tmp_path, "bad.json", annotations=[{"id": 8, "image_id": 103, "category_id": 12}])

    def why(*sets):
        return preflight.instances_problem(load_config("headline", list(sets)).resolved())

    assert why("eval.chair=both", f"eval.coco_instances=[\"{bad}\"]").startswith(f"{bad}: annotations[7]")
    assert why("eval.chair=instances", f"eval.coco_instances=[\"{tmp_path}/gone.json\"]").endswith(
        "fetches instances_{train,val}2014.json")
    assert why("eval.chair=both", f"eval.coco_instances=[\"{_instances(tmp_path)}\"]") is None
    assert why(f"eval.coco_instances=[\"{bad}\"]") is None  # the proxy reads no instances file

"""CHAIR proxy: the matcher rules and a hand-checked example."""

import pytest

from adjcap.metrics.chair import ChairMatcher, chair_proxy, load_vocabulary, parse_synonyms, plural_forms
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
    assert r.per_image["4"] == {"mentioned": ["elephant", "elephant", "train"], "hallucinated": ["train"]}
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
        ("hot-dog stand", ["hot dog"]),
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

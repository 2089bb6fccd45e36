"""The paper's published numbers shipped as data, and the table renderers."""

import pytest

from adjcap.report.published import comparison_table, context_table, load_published, matching_rows, published_table
from adjcap.report.tables import Table, bold_best, latex_escape


def test_published_tables_are_complete_and_consistent():
    pub = load_published()
    assert pub["status"] == "published"
    t = pub["tables"]
    assert {k: v["label"] for k, v in t.items()} == {
        "scoreboard": "tab:scoreboard", "protocols": "tab:protocols", "ablation": "tab:ablation",
        "verifier_substrate": "tab:verifier_substrate", "xdomain": "tab:xdomain", "chair": "tab:chair",
        "reproduction": "tab:reproduction",
    }
    ours = [r for r in t["scoreboard"]["rows"] if r["name"] == "Ours (inductive)"][0]["scores"]
    assert ours == {"B-4": 32.8, "METEOR": 27.9, "ROUGE-L": 55.5, "CIDEr": 117.6, "SPICE": 21.9}
    assert t["ablation"]["rows"][-1]["scores"] == ours == t["protocols"]["rows"][1]["scores"]
    assert [r["scores"]["CIDEr"] for r in t["ablation"]["rows"]] == [108.0, 111.6, 103.7, 105.7, 110.2, 113.1, 115.8, 117.6]
    assert [r["preset"] for r in t["ablation"]["rows"]] == [f"ablation-{i}" for i in range(1, 9)]
    nocaps = {r["corpus"]: r for r in t["xdomain"]["rows"] if r["benchmark"] == "nocaps"}
    # corpus-level CIDEr: overall above every domain, in both columns (as the paper notes)
    for col in ("ifcap", "ours"):
        assert nocaps["overall"][col]["CIDEr"] > max(nocaps[d][col]["CIDEr"] for d in ("in-domain", "near-domain", "out-domain"))
    base, ours_c = t["chair"]["rows"]
    assert (ours_c["CHAIR_s"] - base["CHAIR_s"]) / base["CHAIR_s"] == pytest.approx(-0.41, abs=0.005)
    assert ours_c["n_hallucinated"] / ours_c["n_mentioned"] * 100 == pytest.approx(ours_c["CHAIR_i"], abs=0.01)
    zerocap = t["scoreboard"]["rows"][0]["scores"]
    assert zerocap["B-4"] is None  # '---' in the paper stays missing, never 0


def test_matching_and_comparison_tables():
    rows = matching_rows("training-free", "training-free", "fixed")
    assert [(k, r["scores"]["CIDEr"]) for k, r in rows] == [("protocols", 115.8)]
    assert matching_rows("headline", "inductive", "lm") == []  # the LM pick is not the paper's row
    assert matching_rows("headline", "inductive", "ensemble", benchmark="nocaps") == []
    assert [k for k, _ in matching_rows("headline", "inductive", "ensemble", benchmark="coco")] == [
        "scoreboard", "protocols", "verifier_substrate"]
    tab = comparison_table([("r", "ablation-2", "inductive / lm", {"B-4": 31.0, "CIDEr": 111.0}, "coco")])
    assert tab.rows[0][:2] == ["published [tab:ablation]", "2 ViT-bigG/14 input (drop-in, K=5)"]
    assert tab.rows[2][5] == pytest.approx(111.0 - 111.6) and tab.rows[2][6] is None
    assert comparison_table([("r", "demo", "inductive / ensemble", {}, "demo")]) is None
    nc = context_table("nocaps", [("r in-domain", {"CIDEr": 70.0}, {"CIDEr": 75.0})])
    assert nc.rows[-1] == ["r in-domain", "measured", 70.0, None, 75.0, None]
    assert context_table("demo", []) is None
    assert published_table("verifier_substrate").rows[1][4] == 114.0


def test_table_renderers():
    t = Table(title="T_1 & more", columns=["name", "CIDEr", "n"],
              rows=[["a_b", 101.26, 3], ["c%", None, 4], ["d", 99.0, 4]], label="tab:x")
    bold_best(t, [1, 2])
    md = t.to_markdown()
    assert "| a_b | **101.3** | 3 |" in md and "| c% | n/a | **4** |" in md and "| d | 99.0 | **4** |" in md
    tex = t.to_latex()
    assert "a\\_b & \\textbf{101.3} & 3 \\\\" in tex and "c\\% & --- & \\textbf{4} \\\\" in tex
    same = Table(title="", columns=["x", "v"], rows=[["a", 1.0], ["b", 1.0]])
    bold_best(same, [1])
    assert not same.bold  # nothing singled out when all are equal
    assert "\\begin{tabular}{lcc}" in tex and "\\label{tab:x}" in tex and "T\\_1 \\& more" in tex
    assert "<td class='num'><b>101.3</b></td>" in t.to_html()
    assert latex_escape("50% #1 {x}~") == "50\\% \\#1 \\{x\\}\\textasciitilde{}"

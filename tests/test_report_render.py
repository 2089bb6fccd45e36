"""Reports render: Markdown, HTML gallery with images and captions, PNG plots, LaTeX tables."""

import html
import json
import re
import shutil
from pathlib import Path

import pytest

from adjcap.config import load_config
from adjcap.metrics.run_metrics import evaluate_run
from adjcap.report.report import write_report

FIX = Path(__file__).parent / "fixtures" / "metrics"


def _make_run(root: Path, preset: str = "headline") -> Path:
    """A run directory as the pipeline leaves it, with real captions: the LM-only picker is a
    ViECap-style system's caption, the adjudicated pickers ClipCap's caption of the same image."""
    items = json.loads((FIX / "gallery_6.json").read_text())
    run = root / "run"
    (run / "references").mkdir(parents=True)
    (run / "config.toml").write_text(load_config(preset).to_toml())
    (run / "references" / "coco-test.json").write_text(json.dumps({x["image_id"]: x["references"] for x in items}))
    picks = {
        "inductive": {"lm": "viecap", "ensemble": "clipcap", "trifuse": "clipcap", "memattend": "viecap"},
        "training-free": {"lm": "viecap", "fixed": "clipcap"},
    }
    for proto, pickers in picks.items():
        d = run / "predictions" / proto
        d.mkdir(parents=True)
        for name, src in pickers.items():
            (d / f"{name}.json").write_text(json.dumps([{"image_id": x["image_id"], "caption": x[src]} for x in items]))
    (run / "heads").mkdir()
    (run / "heads" / "heads.json").write_text(json.dumps(
        {"trifuse": {"params": 113, "losses": [2.9, 2.5, 2.4]}, "memattend": {"params": 17377, "seconds": 1.5}}))
    return run


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    run = _make_run(tmp_path_factory.mktemp("a"))
    evaluate_run(run)
    paths = write_report([run], image_root=FIX / "images")
    return run, paths


def test_markdown_has_paper_style_tables_and_published_rows(report):
    run, paths = report
    md = paths["markdown"].read_text()
    assert "| protocol | picker | B-4 | MET | R-L | CIDEr | SPICE | CLIPScore | CHAIR_s |" in md
    assert "| inductive | ensemble |" in md and "| training-free | fixed |" in md
    assert "published [tab:scoreboard]" in md and "Ours (inductive)" in md and "117.6" in md
    assert "reference-proxy CHAIR" in md and "CHAIR_s % (lower is better)" in md
    assert "pick differs from LM-only: ensemble" in md
    assert "trifuse.params" not in md and "[diagnostics.html](diagnostics.html)" in md  # heads.json: own page
    assert "trifuse.params" in (run / "diagnostics.html").read_text()
    assert "SPICE: not requested" in md  # SPICE shown as missing, with the reason
    # the field's published rows stand beside the run's own table, marked as not re-run
    assert "| CapDec | published, not re-run | 26.4 |" in md and "| run (inductive/ensemble) | measured |" in md
    assert md.index("caption metrics (x100)") < md.index("published, not re-run") < md.index("reference-proxy CHAIR (")


def test_html_gallery_contains_images_and_captions(report):
    run, paths = report
    page = paths["html"].read_text()
    items = json.loads((FIX / "gallery_6.json").read_text())
    assert page.count("data:image/jpeg;base64,") == 6  # every image embedded as a thumbnail
    for x in items:
        assert html.escape(x["viecap"]) in page and html.escape(x["clipcap"]) in page
        assert html.escape(x["references"][0]) in page
        assert f"data-id='{x['image_id']}'" in page
    assert "data-gain=" in page and "addEventListener('click'" in page  # sortable by gain
    # per-image CIDEr shown for both captions
    doc = json.loads((run / "metrics" / "inductive.json").read_text())
    first = items[0]["image_id"]
    assert f"{doc['per_image']['ensemble'][first]['CIDEr']:.1f}" in page
    assert "<table class='metrics'>" in page


def test_pngs_exist_and_are_png(report):
    _, paths = report
    names = {p.name for p in paths["plots"]}
    assert {"cider_by_configuration.png", "hallucination_per_class.png"} <= names
    for p in paths["plots"]:
        data = p.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000


def check_latex(text: str) -> None:
    assert text.count("\\begin{tabular}") == text.count("\\end{tabular}") == 1
    assert text.count("\\begin{table}") == text.count("\\end{table}") == 1
    assert "\\toprule" in text and "\\midrule" in text and "\\bottomrule" in text
    spec = re.search(r"\\begin\{tabular\}\{([lcr]+)\}", text).group(1)
    body = text.split("\\toprule", 1)[1].split("\\bottomrule", 1)[0]
    rows = [r for r in body.split("\\\\") if r.strip() and r.strip() not in ("\\midrule",)]
    for r in rows:
        r = r.replace("\\midrule", "")
        if not r.strip():
            continue
        assert len(re.findall(r"(?<!\\)&", r)) == len(spec) - 1, r
    for a, b in (("{", "}"),):
        assert text.replace("\\{", "").count(a) == text.replace("\\}", "").count(b)


def test_latex_tables_are_well_formed(report):
    _, paths = report
    names = {p.name for p in paths["tables"]}
    assert {"run-metrics.tex", "run-chair.tex", "published-vs-measured.tex", "published-coco.tex"} <= names
    for p in paths["tables"]:
        check_latex(p.read_text())


def test_multi_run_side_by_side_and_empty_run(tmp_path, report):
    run_a, _ = report
    run_b = tmp_path / "b" / "run"  # same metrics under another configuration (saves an evaluation)
    shutil.copytree(run_a, run_b)
    (run_b / "config.toml").write_text(load_config("training-free").to_toml())
    empty = tmp_path / "c" / "run"  # a run that was started (config.toml) but never evaluated
    empty.mkdir(parents=True)
    (empty / "config.toml").write_text(load_config("headline").to_toml())
    out = tmp_path / "cmp"
    paths = write_report([run_a, run_b, empty], out, embed_images=False)
    md = paths["markdown"].read_text()
    assert "## Runs side by side" in md
    assert "| run | headline |" in md and "| run-2 | training-free | training-free / fixed |" in md
    assert "| run-3 |" in md and "not evaluated" in md
    assert (out / "tables" / "runs.tex").exists()
    check_latex((out / "tables" / "runs.tex").read_text())
    page = paths["html"].read_text()
    assert "data:image/jpeg" not in page  # embed_images=False and no image root: placeholders
    none = write_report([empty], tmp_path / "none")
    assert "No metrics found" in none["markdown"].read_text()


def test_nocaps_run_reports_domains_and_cross_domain_table(tmp_path):
    corpus = json.loads((FIX / "nocaps_corpus_60.json").read_text())
    preds = {p["image_id"]: p["caption"] for p in json.loads((FIX / "viecap_nocaps_results_60.json").read_text())}
    run = tmp_path / "nocaps-run"
    (run / "references").mkdir(parents=True)
    (run / "config.toml").write_text(load_config("headline", ["benchmark=nocaps"]).to_toml())
    (run / "references" / "nocaps-test.json").write_text(json.dumps({c["image_id"]: c["caption"] for c in corpus}))
    (run / "references" / "nocaps-test.domains.json").write_text(
        json.dumps({c["image_id"]: c["split"] for c in corpus}))
    d = run / "predictions" / "inductive"
    d.mkdir(parents=True)
    (d / "lm.json").write_text(json.dumps([{"image_id": k, "caption": v} for k, v in preds.items()]))
    # stand-in for an adjudicated pick: the last reference of each image (real text)
    (d / "ensemble.json").write_text(json.dumps([{"image_id": c["image_id"], "caption": c["caption"][-1]} for c in corpus]))
    evaluate_run(run)
    paths = write_report([run], embed_images=False)
    md = paths["markdown"].read_text()
    assert "NoCaps domains (inductive)" in md
    for dom in ("in-domain", "near-domain", "out-domain", "overall"):
        assert f"| {dom} | " in md
    assert "[tab:xdomain]" in md and "| nocaps-run overall | measured |" in md
    assert "tab:scoreboard" not in md  # COCO's published rows are not compared with a NoCaps run
    assert (run / "tables" / "nocaps-run-nocaps.tex").exists()
    check_latex((run / "tables" / "nocaps-run-nocaps.tex").read_text())
    assert "<div class='noimg'>" in paths["html"].read_text()  # no images on this machine: placeholders


def _chair_rows(md: str, title_part: str) -> list[list[str]]:
    block = md[md.index(title_part):].split("\n\n")[1]
    return [[c.strip() for c in line.strip("|").split("|")] for line in block.splitlines()[2:]]


def test_named_baseline_run_fills_the_chair_comparison(tmp_path, report):
    run_a, _ = report
    base = tmp_path / "ifcap-run"  # the IFCap baseline run: its own pick is lm (training-free)
    shutil.copytree(run_a, base)
    (base / "config.toml").write_text(load_config("ifcap").to_toml())
    (base / "predictions" / "training-free" / "lm.json").write_text(
        (run_a / "predictions" / "training-free" / "fixed.json").read_text())  # a baseline unlike run_a's lm
    evaluate_run(base)
    paths = write_report([run_a, base], tmp_path / "out", embed_images=False, baseline=base)
    md = paths["markdown"].read_text()
    title = "run: reference-proxy CHAIR (inductive) against baseline ifcap-run (training-free/lm)"
    assert title in md
    rows = _chair_rows(md, title)
    ours = json.loads((run_a / "metrics" / "inductive.json").read_text())["pickers"]
    theirs = json.loads((base / "metrics" / "training-free.json").read_text())["pickers"]["lm"]["chair"]
    assert rows[0][:4] == ["CHAIR_s % (lower is better)", f"{theirs['CHAIR_s']:.2f}",
                           f"{ours['ensemble']['chair']['CHAIR_s']:.2f}", f"{ours['trifuse']['chair']['CHAIR_s']:.2f}"]
    assert "ensemble (this run)" in md and "trifuse (this run)" in md
    assert "| ifcap-run (baseline) | ifcap | training-free / lm |" in md
    assert "ifcap-run: reference-proxy CHAIR" not in md  # the baseline is not compared with itself
    # no baseline named: the old comparison with the run's own LM-only pick
    plain = write_report([run_a], tmp_path / "plain", embed_images=False)["markdown"].read_text()
    assert "against LM-only (this run)" in plain and "(baseline)" not in plain
    with pytest.raises(ValueError, match="no metrics"):
        empty = tmp_path / "empty"
        empty.mkdir()
        write_report([run_a], tmp_path / "x", baseline=empty)


def test_not_applicable_pickers_are_listed(tmp_path, report):
    run_a, _ = report
    run = tmp_path / "noverifier"
    shutil.copytree(run_a, run)
    (run / "fit").mkdir(exist_ok=True)
    (run / "fit" / "training-free.json").write_text(json.dumps(
        {"protocol": "training-free", "not_applicable": {"verifier": "the feature table has no finite verifier scores"}}))
    md = write_report([run], embed_images=False)["markdown"].read_text()
    assert "| training-free | verifier: not applicable (the feature table has no finite verifier scores) |" in md
    assert "could not run on this run's features" in md


def test_main_table_has_a_bootstrap_interval_on_every_metric(report):
    import numpy as np

    from adjcap.metrics.bootstrap import resample_indices

    run, paths = report
    md = paths["markdown"].read_text()
    doc = json.loads((run / "metrics" / "inductive.json").read_text())
    per = doc["per_image"]["ensemble"]
    ids = sorted(per)
    x = np.array([per[i]["CIDEr"] for i in ids])
    means = x[resample_indices(len(ids))].mean(axis=1)
    low, high = np.quantile(means, [0.025, 0.975])
    main = md.split("caption metrics (x100)**", 1)[1]
    row = next(line for line in main.splitlines() if line.startswith("| inductive | ensemble |"))
    assert f"{doc['pickers']['ensemble']['metrics']['CIDEr']:.1f} [{low:.1f}, {high:.1f}]" in row
    assert row.count("[") == 5 and "†" in row  # B-4, MET (†: mean per image), R-L, CIDEr, CHAIR_s (no CLIPScore here)
    assert "95% percentile bootstrap interval over the 6 scored images" in md


def test_report_on_a_directory_that_is_not_a_run_is_one_line_and_non_zero(tmp_path):
    from typer.testing import CliRunner

    from adjcap.cli import app

    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "x.txt").write_text("not a run")
    for target in (tmp_path / "notes", tmp_path / "absent"):
        res = CliRunner().invoke(app, ["report", "--run", str(target)])
        assert res.exit_code != 0
        lines = [ln for ln in res.output.splitlines() if ln.strip()]
        assert len(lines) == 1 and str(target) in lines[0] and "Traceback" not in res.output, res.output
    assert not (tmp_path / "notes" / "report.md").exists()

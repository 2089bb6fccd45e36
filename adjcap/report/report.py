"""``adjcap report --run DIR [--run DIR2 ...]``: report.md, report.html (tables + qualitative
gallery), LaTeX tables (booktabs) in tables/, PNG plots in plots/.

Reads what :func:`adjcap.metrics.run_metrics.evaluate_run` wrote (``metrics/<protocol>.json``), the
run's config, ``heads/heads.json`` (reranker diagnostics) and, for the gallery, predictions,
references and images.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from adjcap.storage.io import atomic_write_text
from adjcap.nested import flatten
from adjcap.report.collect import LM_PICKER, RunData, load_run
from adjcap.report.headline import headline_table
from adjcap.report.intervals import interval_text, picker_intervals
from adjcap.report.page import table_page
from adjcap.storage import provenance
from adjcap.report.gallery import GALLERY_CSS, GALLERY_JS, gallery_html, gallery_items, write_paged_gallery
from adjcap.report.plots import cider_by_configuration, hallucination_per_class
from adjcap.report.seeds import seeds_table
from adjcap.report.published import PAPER_COLUMNS, PAPER_HEADERS, comparison_table, context_table
from adjcap.report.tables import Table, bold_best
from adjcap.storage.rundir import RunDir
from adjcap.storage.samples import read_samples

DOMAINS = ("in-domain", "near-domain", "out-domain", "overall")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-") or "run"


def _labels(runs: list[RunData]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for r in runs:
        base = r.name
        seen[base] = seen.get(base, 0) + 1
        out.append(base if seen[base] == 1 else f"{base}-{seen[base]}")
    return out


# ---------------------------------------------------------------------------------------------
# tables
# ---------------------------------------------------------------------------------------------


def run_intervals(run: RunData) -> dict[tuple[str, str], dict]:
    """(protocol, picker) -> :func:`adjcap.report.intervals.picker_intervals`, computed once a report."""
    return {(proto, picker): picker_intervals(run, proto, picker) for proto in run.protocols
            for picker in run.pickers(proto)}


def metrics_table(run: RunData, label: str, intervals: dict[tuple[str, str], dict] | None = None) -> Table:
    """Paper layout: rows = protocol / picker; B-4, MET, R-L, CIDEr, SPICE (+ CLIPScore, CHAIR_s), each
    with its 95% bootstrap interval over images (``intervals``: from :func:`run_intervals`)."""
    intervals = run_intervals(run) if intervals is None else intervals
    tab = Table(
        title=f"{label}: caption metrics (x100)",
        columns=["protocol", "picker", *PAPER_HEADERS, "CLIPScore", "CHAIR_s"],
        label=f"tab:{_slug(label)}-metrics",
        digits={7: 3, 8: 2},
    )
    n_boot, inexact = 0, set()
    for proto in run.protocols:
        tab.rules.add(len(tab.rows))
        for picker in run.pickers(proto):
            m = run.picker_metrics(proto, picker)
            sc = m.get("metrics", {})
            cs = (m.get("clipscore") or {}).get("CLIPScore")
            ch = (m.get("chair") or {}).get("CHAIR_s")
            tab.rows.append([proto, picker, *(sc.get(c) for c in PAPER_COLUMNS), cs, ch])
            ivs = intervals.get((proto, picker), {})
            for col, name in enumerate((*PAPER_COLUMNS, "CLIPScore", "CHAIR_s"), start=2):
                if name in ivs:
                    iv, exact = ivs[name]
                    tab.suffix[(len(tab.rows) - 1, col)] = interval_text(iv, tab.digits.get(col, 1), exact)
                    n_boot = max(n_boot, iv.n_images)
                    inexact |= {name} if not exact else set()
        for picker, why in sorted(run.not_applicable.get(proto, {}).items()):
            if picker not in run.pickers(proto):
                tab.rows.append([proto, f"{picker}: not applicable ({why})", *([None] * 7)])
    bold_best(tab, [2, 3, 4, 5, 6, 7, 8], lower_is_better={8})
    notes = _spice_notes(run)
    if n_boot:
        tab.caption = (f"[low, high]: 95% percentile bootstrap interval over the {n_boot} scored images (2,000 "
                       "resamples, one resampling shared by every metric of a picker).")
        if inexact:
            tab.caption += (f" †: {', '.join(sorted(inexact))} is not a mean of per-image scores; its interval is "
                            "that of the mean per-image score.")
    if notes:
        tab.caption = (tab.caption + " " if tab.caption else "") + "SPICE: " + notes
    if any(run.not_applicable.values()):
        tab.caption = (tab.caption + " " if tab.caption else "") + (
            "Pickers marked 'not applicable' could not run on this run's features (their inputs are absent).")
    return tab


def _spice_notes(run: RunData) -> str:
    reasons = set()
    for proto in run.protocols:
        for picker in run.pickers(proto):
            n = (run.picker_metrics(proto, picker).get("notes") or {}).get("SPICE")
            if n and run.picker_metrics(proto, picker).get("metrics", {}).get("SPICE") is None:
                reasons.add(n)
    return " / ".join(sorted(reasons))


def domains_table(run: RunData, label: str, proto: str, adj: str) -> Table | None:
    lm_d = run.picker_metrics(proto, LM_PICKER).get("domains")
    adj_d = run.picker_metrics(proto, adj).get("domains")
    if not lm_d and not adj_d:
        return None
    lm_d, adj_d = lm_d or {}, adj_d or {}
    tab = Table(
        title=f"{label}: NoCaps domains ({proto}), each domain its own corpus",
        columns=["corpus", "images", "LM CIDEr", "LM SPICE", f"{adj} CIDEr", f"{adj} SPICE", "delta CIDEr"],
        label=f"tab:{_slug(label)}-nocaps",
    )
    names = [d for d in DOMAINS if d in lm_d or d in adj_d]
    for d in names:
        a, b = lm_d.get(d, {}), adj_d.get(d, {})
        delta = None if a.get("CIDEr") is None or b.get("CIDEr") is None else b["CIDEr"] - a["CIDEr"]
        n = b.get("n_images", a.get("n_images"))
        tab.rows.append([d, n, a.get("CIDEr"), a.get("SPICE"), b.get("CIDEr"), b.get("SPICE"), delta])
    if "overall" in names:
        tab.rules.add(names.index("overall"))
    return tab


@dataclass(frozen=True)
class Baseline:
    """The run a table compares against (``adjcap report --baseline DIR``): its label and headline
    (protocol, picker). Without one, a run is compared against its own LM-only pick."""

    run: RunData
    label: str
    protocol: str
    picker: str

    def metrics(self) -> dict[str, Any]:
        return self.run.picker_metrics(self.protocol, self.picker)

    @property
    def name(self) -> str:
        return f"baseline {self.label} ({self.protocol}/{self.picker})"


# CHAIR's ground truth, as metrics name it (adjcap.metrics.chair): the table's title and caption say which
CHAIR_KINDS = {
    "proxy": ("reference-proxy CHAIR", "when none of the image's references mentions it"),
    "instances": ("instance CHAIR (Rohrbach et al. 2018)",
                  "when neither the image's COCO instance annotations nor its references have it"),
}


def chair_table(run: RunData, label: str, proto: str, adj: str, baseline: Baseline | None = None,
                key: str = "chair") -> Table | None:
    """CHAIR of the run's pick against the baseline run's pick (the paper: the IFCap run vs the
    TriFuse pick; a TriFuse column is added when the run has one), or against this run's LM-only
    pick when no baseline is named. ``key``: "chair" (as eval.chair chose) or "chair_instances"
    (the instance CHAIR beside the proxy, eval.chair = both)."""
    if baseline is not None:
        a, base_name = baseline.metrics().get(key), baseline.name
    else:
        a, base_name = run.picker_metrics(proto, LM_PICKER).get(key), "LM-only (this run)"
    cols = [(adj, run.picker_metrics(proto, adj).get(key))]
    if baseline is not None and adj != "trifuse" and "trifuse" in run.pickers(proto):
        cols.append(("trifuse", run.picker_metrics(proto, "trifuse").get(key)))
    cols = [(n, c) for n, c in cols if c]
    if not a or not cols or (baseline is None and adj == LM_PICKER):
        return None

    def rel(x: float, y: float) -> float | None:
        return None if not x else 100.0 * (y - x) / x

    kinds = {c.get("ground_truth", "proxy") for _, c in cols} | {a.get("ground_truth", "proxy")}
    if len(kinds) > 1:  # a baseline scored with the other ground truth is no comparison
        return None
    kind, rule = CHAIR_KINDS[kinds.pop()]
    tab = Table(
        title=f"{label}: {kind} ({proto}) against {base_name}",
        columns=["", base_name, *(f"{n} (this run)" if baseline is not None else n for n, _ in cols),
                 *(f"rel. delta % {n}" for n, _ in cols)],
        label=f"tab:{_slug(label)}-{key.replace('_', '-')}",
        digits={i: (0 if i > 1 + len(cols) else 2) for i in range(1, 2 + 2 * len(cols))},
    )
    keys = [("CHAIR_s % (lower is better)", "CHAIR_s"), ("CHAIR_i % (lower is better)", "CHAIR_i"),
            ("# objects mentioned", "n_mentioned"), ("# hallucinated objects", "n_hallucinated")]
    tab.rows = [[name, a[k], *(c[k] for _, c in cols), *(rel(a[k], c[k]) for _, c in cols)] for name, k in keys]
    tab.caption = (
        f"An object (COCO class, standard CHAIR synonyms) in a caption counts as hallucinated {rule}; "
        f"{cols[0][1]['n_captions']} captions. Baseline: {base_name}."
    )
    return tab


def rank_table(run: RunData, label: str) -> Table | None:
    tab = Table(title=f"{label}: rank statistics", columns=["protocol", "statistic", "value"], default_digits=3)
    for proto in run.protocols:
        st = run.metrics[proto].get("rank_stats") or {}
        sp = st.get("retrieval_verifier_spearman")
        if sp and sp.get("mean") is not None:
            tab.rows.append([proto, f"Spearman rho(retrieval cosine, verifier), mean over {sp['n_images']} images "
                             f"({sp.get('source')} pairs, {sp.get('pairs_per_image') or 0:.1f} per image)", sp["mean"]])
            tab.rows.append([proto, "  std over images", sp["std"]])
        for picker, v in (st.get("pick_disagreement_vs_lm") or {}).items():
            tab.rows.append([proto, f"pick differs from LM-only: {picker}", v])
        if st.get("top1_agreement_heads") is not None:
            tab.rows.append([proto, "top-1 agreement TriFuse vs MemAttend", st["top1_agreement_heads"]])
    return tab if tab.rows else None


# heads.json parts that repeat the config or another entry
_HEADS_SKIP = ("meta.rerank", "meta.losses")


def _summary(v: Any) -> str:
    """A heads.json value as a diagnostics cell: numbers rounded, lists summarised."""
    if isinstance(v, list):
        nums = [x for x in v if isinstance(x, (int, float)) and not isinstance(x, bool)]
        if nums and len(nums) == len(v):
            return f"{len(v)} values, first {nums[0]:.4g}, last {nums[-1]:.4g}"
        return f"{len(v)} items"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def heads_table(run: RunData, label: str) -> Table | None:
    if not run.heads:
        return None
    flat = flatten(run.heads, empty_is_leaf=False, max_depth=4)
    rows = [[k, _summary(v)] for k, v in flat.items()
            if not any(k == s or k.startswith(s + ".") for s in _HEADS_SKIP)]
    return Table(title=f"{label}: reranker diagnostics (heads/heads.json)", columns=["field", "value"], rows=rows[:80])


def runs_table(runs: list[RunData], labels: list[str], baseline: Baseline | None = None) -> Table:
    tab = Table(
        title="Runs side by side: headline configuration of each run (x100)",
        columns=["run", "config", "protocol / picker", *PAPER_HEADERS, "CLIPScore", "CHAIR_s", "images"],
        label="tab:runs",
        digits={8: 3, 9: 2},
    )
    for run, lab in zip(runs, labels):
        hl = run.headline()
        if baseline is not None and run is baseline.run:
            lab = f"{lab} (baseline)"
        if hl is None:
            tab.rows.append([lab, run.config_name or "", "not evaluated", *([None] * 7), None])
            continue
        proto, picker = hl
        m = run.picker_metrics(proto, picker)
        sc = m.get("metrics", {})
        tab.rows.append([
            lab, run.config_name or "", f"{proto} / {picker}", *(sc.get(c) for c in PAPER_COLUMNS),
            (m.get("clipscore") or {}).get("CLIPScore"), (m.get("chair") or {}).get("CHAIR_s"), m.get("n_images"),
        ])
    bold_best(tab, [3, 4, 5, 6, 7, 8, 9], lower_is_better={9})
    return tab


def peers_table(run: RunData, label: str, baseline: Baseline | None = None) -> Table | None:
    """A COCO / Flickr30k / NoCaps run beside the field: the published rows of the peers on its
    benchmark (``resources/published.json``, marked "published, not re-run") with the run's headline
    row; None on other benchmarks (the demo world, a folder) or before evaluation."""
    hl = run.headline()
    if hl is None or run.benchmark not in ("coco", "flickr30k", "nocaps"):
        return None
    if baseline is not None and run is baseline.run and run.benchmark != "coco":
        return None  # it fills the IFCap columns of the other runs
    proto, adj = hl
    if run.benchmark == "coco":
        tab = context_table("coco", [(f"{label} ({proto}/{adj})", run.picker_metrics(proto, adj).get("metrics", {}),
                                      None)])
    else:
        lm_m = (baseline.metrics() if baseline is not None and baseline.run.benchmark == run.benchmark
                else run.picker_metrics(proto, LM_PICKER))
        adj_m = run.picker_metrics(proto, adj)
        if run.benchmark == "nocaps" and adj_m.get("domains"):
            rows = [(f"{label} {d}", (lm_m.get("domains") or {}).get(d, {}), adj_m["domains"].get(d, {}))
                    for d in DOMAINS if d in adj_m["domains"]]
        else:
            rows = [(f"{label} all", lm_m.get("metrics", {}), adj_m.get("metrics", {}))]
        tab = context_table(run.benchmark, rows)
        if tab is not None:
            src = (f"measured IFCap columns: {baseline.name}" if baseline is not None
                   and baseline.run.benchmark == run.benchmark
                   else "measured IFCap columns: this run's own LM-only pick (no --baseline named)")
            tab.caption = (tab.caption + " " if tab.caption else "") + src + "."
    if tab is not None:
        tab.title = f"{label} beside the field: {tab.title}"
        tab.caption = ((tab.caption + " ") if tab.caption else "") + (
            "Rows marked 'published, not re-run' are the peers' numbers as their papers report them (same "
            "benchmark and split, their own setups); only the 'measured' rows were run here.")
    return tab


# ---------------------------------------------------------------------------------------------
# the report
# ---------------------------------------------------------------------------------------------


def _baseline(runs: list[RunData], labels: list[str], path: str | Path | None) -> Baseline | None:
    if path is None:
        return None
    want = Path(path).resolve()
    for run, lab in zip(runs, labels):
        if run.path.resolve() == want:
            break
    else:
        run = load_run(path)
        lab = run.name
    hl = run.headline()
    if hl is None:
        raise ValueError(f"--baseline {path}: the run has no metrics; run `adjcap evaluate --run {path}` first")
    proto, picker = hl
    if run.picker in run.pickers(proto):
        picker = run.picker  # the baseline's own configured pick (the IFCap run: lm, IFCap's beam pick)
    return Baseline(run, lab, proto, picker)


@dataclass
class _Page:
    """The report as it is written: its Markdown and HTML parts, the LaTeX tables and plots written so
    far and the galleries (HTML) that end the page."""

    dest: RunDir
    single: bool  # one run reported (file names without the run's label)
    md: list[str] = field(default_factory=list)
    body: list[str] = field(default_factory=list)
    tables: list[Path] = field(default_factory=list)
    plots: list[Path] = field(default_factory=list)
    galleries: list[str] = field(default_factory=list)

    def add(self, tab: Table | None, tex_name: str | None = None) -> None:
        """A table in both documents and, named, as tables/<name>.tex."""
        if tab is None:
            return
        self.md.append(tab.to_markdown())
        self.body.append(tab.to_html())
        if tex_name:
            p = self.dest.tables_dir / f"{_slug(tex_name)}.tex"
            atomic_write_text(p, tab.to_latex())
            self.tables.append(p)

    def heading(self, level: int, text: str) -> None:
        self.md.append(f"{'#' * level} {text}\n")
        self.body.append(f"<h{level}>{html.escape(text)}</h{level}>")

    def paragraph(self, text: str) -> None:
        self.md.append(f"{text}\n")
        self.body.append(f"<p>{html.escape(text)}</p>")


@dataclass(frozen=True)
class _GalleryOptions:
    limit: int
    image_root: Path | None
    embed: bool


def _check_run_dirs(run_dirs: Sequence[str | Path]) -> None:
    if not run_dirs:
        raise ValueError("write_report: give at least one run directory")
    for p in run_dirs:
        if not RunDir(p).is_run():
            raise ValueError(f"{p}: not an adjcap run directory (no config.toml or metrics/ in it); give a directory "
                             "written by `adjcap run-job`, `adjcap demo`, `adjcap caption` or `adjcap reproduce`")


def _front_matter(page: _Page, runs: list[RunData], labels: list[str]) -> None:
    """The title, what made each run (provenance.json, in short), each run's headline table and the list of runs."""
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    page.md.append("# adjcap report\n")
    page.md.append(f"Generated {stamp}. All caption metrics x100 (pycocoevalcap); CLIPScore w=2.5 (not x100); "
                   "CHAIR proxy in %. 'n/a' = not computed (never 0).\n")
    page.body.append("<h1>adjcap report</h1>")
    page.body.append(f"<p>Generated {html.escape(stamp)}. Caption metrics x100; CLIPScore w=2.5; CHAIR proxy in %; "
                     "n/a = not computed.</p>")
    for run, lab in zip(runs, labels):
        prov = RunDir(run.path).provenance()
        if prov:
            page.md.append((f"**{lab}** " if len(runs) > 1 else "") + provenance.short_markdown(prov))
            page.body.append((f"<p><b>{html.escape(lab)}</b></p>" if len(runs) > 1 else "")
                             + provenance.short_html(prov))
    for run, lab in zip(runs, labels):  # the first table: the paper's headline comparison, per run
        page.add(headline_table(run, lab), f"{lab}-headline")
    page.add(run_list_table(runs, labels))
    if not any(r.metrics for r in runs):
        page.md.append("No metrics found: run `adjcap evaluate --run DIR` first.\n")
        page.body.append("<p>No metrics found: run <code>adjcap evaluate --run DIR</code> first.</p>")


def run_list_table(runs: list[RunData], labels: list[str]) -> Table:
    tab = Table(title="Runs", columns=["run", "config", "benchmark", "protocols", "failed images", "description"])
    for run, lab in zip(runs, labels):
        failed = max((int((m.get("failed_images") or {}).get("count", 0)) for m in run.metrics.values()), default=0)
        tab.rows.append([lab, run.config_name or "", run.benchmark or "", ", ".join(run.protocols) or "none",
                         f"{failed} (not scored)" if failed else "0", run.description])
    return tab


CiderRow = tuple[str, float | None, tuple[float, float] | None]  # (label, CIDEr, its interval)


def _metrics_section(page: _Page, run: RunData, lab: str, base: Baseline | None) -> list[CiderRow]:
    """The run's heading and main tables (metrics, seed study, peers); its CIDEr per picker for the plot."""
    page.heading(2, lab)
    if run.description:
        page.paragraph(run.description)
    if run.captioner:
        page.paragraph(run.captioner)
    ivs = run_intervals(run)
    page.add(metrics_table(run, lab, ivs), f"{lab}-metrics")
    for proto in run.protocols:  # rerank.seeds: the seed study beside the main table
        page.add(seeds_table(run, lab, proto), f"{lab}-{proto}-seeds")
    page.add(peers_table(run, lab, base), "published-" + (run.benchmark or "") if page.single
             else f"{lab}-published-{run.benchmark}")
    rows: list[CiderRow] = []
    for proto in run.protocols:
        for picker in run.pickers(proto):
            c = run.picker_metrics(proto, picker).get("metrics", {}).get("CIDEr")
            iv = ivs.get((proto, picker), {}).get("CIDEr")
            rows.append((f"{proto}/{picker}" if page.single else f"{lab}: {proto}/{picker}", c,
                         (iv[0].low, iv[0].high) if iv else None))
    return rows


def _chair_section(page: _Page, run: RunData, lab: str, proto: str, adj: str, base: Baseline | None) -> None:
    """The CHAIR tables (proxy, and instances beside it) and the hallucinated objects per class plot."""
    if base is not None and run is base.run:
        ch = None  # the baseline is not compared against itself
    else:
        ch = chair_table(run, lab, proto, adj, base)
    page.add(ch, f"{lab}-chair")
    if ch is None:
        return
    page.add(chair_table(run, lab, proto, adj, base, key="chair_instances"), f"{lab}-chair-instances")
    base_chair = base.metrics()["chair"] if base is not None else run.picker_metrics(proto, LM_PICKER)["chair"]
    series = {
        (base.label if base is not None else "LM-only"): base_chair.get("per_class", {}),
        adj: run.picker_metrics(proto, adj)["chair"].get("per_class", {}),
    }
    name = "hallucination_per_class.png" if page.single else f"hallucination_per_class-{_slug(lab)}.png"
    page.plots.append(hallucination_per_class(series, page.dest.plots_dir / name,
                                              title=f"{lab}: hallucinated objects per class"))
    page.md.append(f"![hallucinated objects per class](plots/{name})\n")


def _diagnostics_link(page: _Page, run: RunData, lab: str) -> None:
    """The reranker diagnostics dump on a page of its own, linked from the report."""
    heads = heads_table(run, lab)
    if heads is None:
        return
    dpath = page.dest.diagnostics_html(None if page.single else _slug(lab))
    atomic_write_text(dpath, table_page(heads, f"{lab}: reranker diagnostics",
                                        f"Every field of {run.path / 'heads' / 'heads.json'} (numbers rounded; "
                                        "lists summarised)."))
    page.md.append(f"Reranker diagnostics (heads/heads.json): [{dpath.name}]({dpath.name})\n")
    page.body.append(f"<p>Reranker diagnostics (heads/heads.json): "
                     f"<a href='{html.escape(dpath.name)}'>{html.escape(dpath.name)}</a></p>")


def _gallery_section(page: _Page, run: RunData, lab: str, proto: str, adj: str, opts: _GalleryOptions) -> None:
    """The qualitative gallery (LM-only vs the pick) on the report and every image on a paged gallery."""
    if LM_PICKER not in run.pickers(proto) or adj == LM_PICKER:
        return
    samples = read_samples(RunDir(run.path))
    root = Path(opts.image_root) if opts.image_root else run.image_root
    items = gallery_items(run, proto, adj, limit=opts.limit, image_root=root, embed=opts.embed, samples=samples)
    tag = None if page.single else _slug(lab)
    paged = write_paged_gallery(samples, page.dest.gallery_html(tag), page.dest.gallery_dir(tag), proto, adj,
                                title=f"{lab}: every image, LM-only vs {adj} ({proto})",
                                split=run.apply_split, image_root=root)
    link = paged["html"].name
    page.galleries.append(gallery_html(items, title=f"{lab}: LM-only vs {adj} ({proto}), {len(items)} images",
                                       table_id=f"gallery-{_slug(lab)}", adj_name=adj)
                          + f"<p>Every image ({paged['images']}), paged, with each candidate's judge scores: "
                          f"<a href='{html.escape(link)}'>{html.escape(link)}</a></p>")
    page.md.append(f"Qualitative gallery ({len(items)} images, sortable by CIDEr gain): report.html; "
                   f"every image ({paged['images']}), paged: [{link}]({link})\n")


def _closing_sections(page: _Page, runs: list[RunData], measured: list, cider_rows: list[CiderRow]) -> None:
    """The published numbers beside the measured headlines and the CIDEr by configuration plot."""
    pub = comparison_table(measured)
    if pub is not None:
        page.heading(2, "Published numbers")
        page.add(pub, "published-vs-measured")
    published_lines = {}
    if any(r.benchmark == "coco" for r in runs):
        published_lines = {"IFCap": 108.0, "Ours (paper)": 117.6}
    if cider_rows:
        page.plots.append(cider_by_configuration(cider_rows, page.dest.plots_dir / "cider_by_configuration.png",
                                                 published=published_lines))
        page.md.append("## Plots\n")
        page.md.append("![CIDEr by configuration](plots/cider_by_configuration.png)\n")


def _html_document(page: _Page) -> str:
    plots_html = "".join(
        f"<figure><img src='{html.escape(str(p.relative_to(page.dest.path)))}' style='max-width:900px'></figure>"
        for p in page.plots
    )
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>adjcap report</title>"
        f"<style>{GALLERY_CSS}</style></head><body>"
        + "\n".join(page.body)
        + ("<h2>Plots</h2>" + plots_html if plots_html else "")
        + ("<h2>Qualitative gallery</h2><p>LM-only caption (red) vs adjudicated caption (blue), references and "
           "per-image CIDEr. Click a column header to sort (gain = adjudicated - LM-only CIDEr).</p>"
           + "\n".join(page.galleries) if page.galleries else "")
        + f"<script>{GALLERY_JS}</script></body></html>"
    )


def write_report(
    run_dirs: Sequence[str | Path],
    out_dir: str | Path | None = None,
    *,
    gallery_limit: int = 60,
    image_root: str | Path | None = None,
    embed_images: bool = True,
    baseline: str | Path | None = None,
) -> dict[str, Any]:
    """Write report.md, report.html, tables/*.tex and plots/*.png for one or more runs.

    ``out_dir`` defaults to the first run directory. ``baseline``: the run the CHAIR table and the
    cross-domain "IFCap" columns compare against (e.g. the IFCap baseline run; one of ``run_dirs`` or
    another run directory); default: each run's own LM-only pick. Returns the written paths:
    {"markdown", "html", "tables": [...], "plots": [...]}.
    """
    _check_run_dirs(run_dirs)
    runs = [load_run(p) for p in run_dirs]
    labels = _labels(runs)
    base = _baseline(runs, labels, baseline)
    page = _Page(RunDir(Path(out_dir) if out_dir is not None else runs[0].path), single=len(runs) == 1)
    page.dest.path.mkdir(parents=True, exist_ok=True)
    gallery = _GalleryOptions(gallery_limit, Path(image_root) if image_root else None, embed_images)
    _front_matter(page, runs, labels)
    if len(runs) > 1:
        page.heading(2, "Runs side by side")
        page.add(runs_table(runs, labels, base), "runs")
    cider_rows: list[CiderRow] = []
    measured: list[tuple[str, str, str, dict[str, Any], str | None]] = []  # each run's headline, for the published
    for run, lab in zip(runs, labels):
        if not run.metrics:
            continue
        cider_rows += _metrics_section(page, run, lab, base)
        hl = run.headline()
        if hl is None:
            continue
        proto, adj = hl
        measured.append((lab, run.config_name or "", f"{proto} / {adj}",
                         run.picker_metrics(proto, adj).get("metrics", {}), run.benchmark))
        page.add(domains_table(run, lab, proto, adj), f"{lab}-nocaps")
        _chair_section(page, run, lab, proto, adj, base)
        page.add(rank_table(run, lab))
        _diagnostics_link(page, run, lab)
        _gallery_section(page, run, lab, proto, adj, gallery)
    _closing_sections(page, runs, measured, cider_rows)
    md_path = atomic_write_text(page.dest.report_md, "\n".join(page.md))
    html_path = atomic_write_text(page.dest.report_html, _html_document(page))
    return {"markdown": md_path, "html": html_path, "tables": page.tables, "plots": page.plots}

"""``adjcap compare RUN_A RUN_B [RUN_C ...]``: is run B better than run A, and how sure is it?

For every protocol and picker both runs evaluated, and every metric both have per-image values for,
the difference B - A with a paired percentile bootstrap interval over the images both runs scored.
One resampling of those images (:func:`adjcap.metrics.bootstrap.resample_indices`) serves every
metric of a (protocol, picker), so the intervals of CIDEr and CHAIR_i come from the same draws. How
each metric is made from per-image values is :data:`adjcap.metrics.bootstrap.PER_IMAGE_STATISTICS`
(the same statistics the report's main table bootstraps).

Runs are comparable only on the same references: a different benchmark, split, image set or
reference text is refused with one line naming the difference; ``intersection=True`` compares on
the images both runs share (their references must still agree there). What differs in the runs'
``config.toml`` and ``provenance.json`` is listed beside the numbers.
"""

from __future__ import annotations

import html
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adjcap.storage.io import atomic_write_text
from adjcap.metrics.bootstrap import (
    BOOTSTRAP_SAMPLES,
    PER_IMAGE_STATISTICS,
    PairedDifference,
    paired_bootstrap,
    resample_indices,
    statistic_matrices,
)
from adjcap.report.collect import RunData, load_run
from adjcap.report.page import html_page
from adjcap.report.seeds import seeds_table
from adjcap.report.tables import Table
from adjcap.storage.rundir import RunDir

# provenance fields that differ between any two runs and say nothing about their results
VOLATILE_PROVENANCE = ("started_utc", "finished_utc", "seconds", "steps", "later_steps", "status")


class NotComparable(ValueError):
    """Two runs that cannot be compared image by image (one line: what differs, what to do)."""


@dataclass
class MetricDifference:
    metric: str
    diff: PairedDifference | None  # None: a run lacks per-image values for it
    lower_is_better: bool
    exact: bool
    digits: int
    why_missing: str = ""


@dataclass
class PickerComparison:
    protocol: str
    picker: str
    n_images: int
    metrics: list[MetricDifference] = field(default_factory=list)
    left_out: tuple[int, int] = (0, 0)  # images scored only in A, only in B (intersection)


@dataclass
class Comparison:
    """B - A for every shared protocol / picker / metric."""

    a: RunData
    b: RunData
    label_a: str
    label_b: str
    pickers: list[PickerComparison]
    config_diff: list[tuple[str, Any, Any]]
    provenance_diff: list[tuple[str, Any, Any]]
    only_a: list[str]  # "protocol/picker" evaluated in A only
    only_b: list[str]
    intersection_note: str = ""
    samples: int = BOOTSTRAP_SAMPLES
    level: float = 0.95


# ---------------------------------------------------------------------------------------------
# comparability
# ---------------------------------------------------------------------------------------------


def _reference_set(run: RunData) -> tuple[tuple[str, str] | None, dict[str, list[str]]]:
    """((benchmark, split), {image id: references}) of the split the run's pickers were applied to."""
    rd = RunDir(run.path)
    cands = [(b, s) for b, s in rd.reference_splits() if s == run.apply_split]
    mine = [(b, s) for b, s in cands if b == run.benchmark]
    chosen = (mine or cands)[:1]
    if not chosen:
        return None, {}
    return chosen[0], rd.references(*chosen[0])


def _examples(ids: set[str] | list[str], n: int = 3) -> str:
    s = sorted(ids)
    return ", ".join(s[:n]) + (", ..." if len(s) > n else "")


def check_comparable(a: RunData, b: RunData, intersection: bool = False) -> tuple[set[str] | None, str]:
    """The images the comparison may use (None: all scored images, the sets being equal) and a note
    on what ``intersection`` left out; raises :class:`NotComparable` naming the first difference."""
    (where_a, refs_a), (where_b, refs_b) = _reference_set(a), _reference_set(b)
    if not refs_a or not refs_b:
        missing = a if not refs_a else b
        raise NotComparable(f"{missing.path}: no references/<benchmark>-{missing.apply_split}.json; "
                            "is it a finished run? (run `adjcap run-job` or `adjcap evaluate` first)")
    if where_a != where_b and not intersection:
        raise NotComparable(f"{a.path} is {'/'.join(where_a or ('?',))}, {b.path} is "
                            f"{'/'.join(where_b or ('?',))}: different references; compare runs of one "
                            "benchmark and split")
    shared = set(refs_a) & set(refs_b)
    changed = {i for i in shared if list(refs_a[i]) != list(refs_b[i])}
    if changed:
        raise NotComparable(f"different references: {len(changed)} of the {len(shared)} shared images have other "
                            f"reference captions in {a.path} and {b.path} (e.g. {_examples(changed)}); "
                            "runs are compared on the same references only")
    if set(refs_a) != set(refs_b):
        only_a, only_b = set(refs_a) - shared, set(refs_b) - shared
        if not intersection:
            raise NotComparable(
                f"different image sets: {a.path} has {len(refs_a)} images, {b.path} {len(refs_b)}, {len(shared)} "
                f"shared ({len(only_a)} only in A, {len(only_b)} only in B, e.g. {_examples(only_a or only_b)}); "
                "--intersection compares on the shared images")
        if not shared:
            raise NotComparable(f"{a.path} and {b.path} share no images")
        return shared, (f"--intersection: compared on the {len(shared)} shared images ({len(only_a)} only in "
                        f"{a.name}, {len(only_b)} only in {b.name} left out)")
    return None, ""


# ---------------------------------------------------------------------------------------------
# config and provenance differences
# ---------------------------------------------------------------------------------------------


def _leaves(prefix: str, v: Any, out: dict[str, Any]) -> dict[str, Any]:
    if isinstance(v, dict):
        for k, x in v.items():
            _leaves(f"{prefix}.{k}" if prefix else str(k), x, out)
    else:
        out[prefix] = v
    return out


def diff_mappings(a: dict[str, Any], b: dict[str, Any], skip: tuple[str, ...] = ()) -> list[tuple[str, Any, Any]]:
    """(dotted key, value in a, value in b) of every leaf that differs; absent = None."""
    fa, fb = _leaves("", a, {}), _leaves("", b, {})
    keys = sorted(set(fa) | set(fb))
    return [(k, fa.get(k), fb.get(k)) for k in keys
            if fa.get(k) != fb.get(k) and not any(k == s or k.startswith(s + ".") for s in skip)]


def _config(run: RunData) -> dict[str, Any]:
    p = RunDir(run.path).config_path
    try:
        return tomllib.loads(p.read_text(encoding="utf-8")) if p.exists() else {}
    except (OSError, tomllib.TOMLDecodeError):
        return {}


# ---------------------------------------------------------------------------------------------
# the comparison
# ---------------------------------------------------------------------------------------------


def _pairs(run: RunData) -> list[tuple[str, str]]:
    return [(proto, picker) for proto in run.protocols for picker in run.pickers(proto)]


def compare_runs(a: RunData, b: RunData, *, intersection: bool = False, label_a: str | None = None,
                 label_b: str | None = None, samples: int = BOOTSTRAP_SAMPLES, level: float = 0.95) -> Comparison:
    """B - A (see the module docstring)."""
    allowed, note = check_comparable(a, b, intersection)
    pa_, pb_ = _pairs(a), _pairs(b)
    shared_pairs = [p for p in pa_ if p in pb_]
    if not shared_pairs:
        raise NotComparable(f"{a.path} and {b.path} have no protocol/picker evaluated in both "
                            f"(A: {', '.join('/'.join(p) for p in pa_) or 'none'}; "
                            f"B: {', '.join('/'.join(p) for p in pb_) or 'none'}); run `adjcap evaluate` on both")
    out: list[PickerComparison] = []
    for proto, picker in shared_pairs:
        ia, ib = a.per_image(proto, picker), b.per_image(proto, picker)
        sa, sb = set(ia), set(ib)
        if allowed is not None:
            sa, sb = sa & allowed, sb & allowed
        if sa != sb and not intersection:
            raise NotComparable(
                f"{proto}/{picker}: different scored images ({len(sa - sb)} only in {a.path}, {len(sb - sa)} only "
                f"in {b.path}, e.g. {_examples((sa - sb) or (sb - sa))}; failed images differ); --intersection "
                "compares on the images both scored")
        ids = sorted(sa & sb)
        pc = PickerComparison(proto, picker, len(ids), left_out=(len(sa - sb), len(sb - sa)))
        out.append(pc)
        if not ids:
            continue
        draws = resample_indices(len(ids), samples)  # one resampling for every metric of this picker
        for name in PER_IMAGE_STATISTICS:
            st, xa, xb = statistic_matrices(name, ia, ib, ids)
            if xa is None and xb is None:
                continue  # neither run computed it (e.g. SPICE not requested)
            md = MetricDifference(name, None, st.lower_is_better, st.exact, st.digits)
            if xa is None or xb is None:
                md.why_missing = f"no per-image {name} in {a.name if xa is None else b.name}"
            elif st.statistic is not None and name.startswith("CHAIR") and xa[:, 0].sum() == 0 and xb[:, 0].sum() == 0:
                md.why_missing = "no COCO object mentioned in either run"
            else:
                md.diff = paired_bootstrap(xa, xb, st.statistic, samples=samples, level=level, indices=draws)
            pc.metrics.append(md)
    prov_a, prov_b = RunDir(a.path).provenance(), RunDir(b.path).provenance()
    return Comparison(
        a=a, b=b, label_a=label_a or a.name, label_b=label_b or b.name, pickers=out,
        config_diff=diff_mappings(_config(a), _config(b)),
        provenance_diff=diff_mappings(prov_a, prov_b, VOLATILE_PROVENANCE) if prov_a and prov_b else [],
        only_a=["/".join(p) for p in pa_ if p not in pb_], only_b=["/".join(p) for p in pb_ if p not in pa_],
        intersection_note=note, samples=samples, level=level)


# ---------------------------------------------------------------------------------------------
# rendering
# ---------------------------------------------------------------------------------------------


def _signed(v: float, digits: int) -> str:
    return f"{v:+.{digits}f}"


def verdict(md: MetricDifference) -> str:
    """'B better' / 'B worse' when the interval excludes zero, else 'no clear difference'."""
    d = md.diff
    if d is None:
        return ""
    if not d.excludes_zero:
        return "no clear difference"
    better = (d.delta < 0) if md.lower_is_better else (d.delta > 0)
    return "B better" if better else "B worse"


def differences_table(c: Comparison, pc: PickerComparison) -> Table:
    tab = Table(
        title=f"{pc.protocol} / {pc.picker}: {c.label_b} (B) - {c.label_a} (A), {pc.n_images} images",
        columns=["metric", "A", "B", "B - A", f"{int(round(100 * c.level))}% CI", "verdict"],
    )
    for md in pc.metrics:
        name = md.metric + ("" if md.exact else " (mean per image)") + (" (lower is better)" if md.lower_is_better else "")
        d = md.diff
        if d is None:
            tab.rows.append([name, None, None, None, None, md.why_missing])
            continue
        mark = " *" if d.excludes_zero else ""
        tab.rows.append([name, f"{d.a:.{md.digits}f}", f"{d.b:.{md.digits}f}", _signed(d.delta, md.digits),
                         f"[{_signed(d.low, md.digits)}, {_signed(d.high, md.digits)}]{mark}", verdict(md)])
    return tab


def _caption(c: Comparison) -> str:
    inexact = sorted({md.metric for pc in c.pickers for md in pc.metrics if not md.exact and md.diff})
    text = (f"Paired percentile bootstrap over the images both runs scored ({c.samples:,} resamples, one "
            "resampling shared by every metric of a picker); * = the interval excludes zero. Caption metrics x100, "
            "CLIPScore w=2.5, CHAIR (reference proxy) in %.")
    if inexact:
        text += (f" {', '.join(inexact)}: the corpus figures of the report are not means of per-image scores; "
                 "compared here as the mean per-image score.")
    return text


def diff_table(title: str, rows: list[tuple[str, Any, Any]], la: str, lb: str) -> Table:
    def show(v: Any) -> str:
        if v is None:
            return "(absent)"
        s = str(v)
        return s if len(s) <= 120 else s[:117] + "..."

    return Table(title=title, columns=["key", la, lb], rows=[[k, show(x), show(y)] for k, x, y in rows])


def to_text(c: Comparison) -> str:
    """The terminal view: one block per protocol / picker."""
    lines = [f"compare: B = {c.label_b} ({c.b.path.resolve()})  vs  A = {c.label_a} ({c.a.path.resolve()})"]
    if c.intersection_note:
        lines.append(c.intersection_note)
    for pc in c.pickers:
        tab = differences_table(c, pc)
        rows = [tab.columns] + [["" if x is None else str(x) for x in row] for row in tab.rows]
        widths = [max(len(str(x[k])) for x in rows) for k in range(len(tab.columns))]
        lines += ["", tab.title]
        for row in rows:
            lines.append("  " + "  ".join(str(x).ljust(w) if k in (0, 5) else str(x).rjust(w)
                                          for k, (x, w) in enumerate(zip(row, widths))).rstrip())
    for tab in seed_tables(c):
        lines += ["", tab.title, tab.to_markdown().split("\n", 2)[-1].rstrip()]
    lines += ["", _caption(c)]
    if c.only_a or c.only_b:
        lines.append(f"evaluated in one run only: A {', '.join(c.only_a) or '-'}; B {', '.join(c.only_b) or '-'}")
    for title, rows in (("config.toml differs", c.config_diff), ("provenance.json differs", c.provenance_diff)):
        lines += ["", f"{title}:" if rows else f"{title}: nothing"]
        for k, x, y in rows:
            lines.append(f"  {k}: A {x!r}  B {y!r}")
    return "\n".join(lines) + "\n"


def seed_tables(c: Comparison) -> list[Table]:
    """Each run's seed study (rerank.seeds), for the protocols that have one."""
    return [t for run, lab in ((c.a, c.label_a), (c.b, c.label_b)) for proto in run.protocols
            if (t := seeds_table(run, lab, proto)) is not None]


def _tables(c: Comparison) -> list[Table]:
    tabs = [differences_table(c, pc) for pc in c.pickers]
    if tabs:
        tabs[-1].caption = _caption(c)
    tabs += seed_tables(c)
    tabs.append(diff_table("config.toml: what differs", c.config_diff, c.label_a, c.label_b))
    tabs.append(diff_table("provenance.json: what differs (times and steps left out)", c.provenance_diff,
                           c.label_a, c.label_b))
    return tabs


def _header(c: Comparison) -> tuple[str, str]:
    md = (f"## {c.label_b} (B) vs {c.label_a} (A)\n\nA: `{c.a.path.resolve()}`  \nB: `{c.b.path.resolve()}`\n"
          + (f"\n{c.intersection_note}\n" if c.intersection_note else "")
          + (f"\nEvaluated in one run only: A {', '.join(c.only_a) or '-'}; B {', '.join(c.only_b) or '-'}\n"
             if c.only_a or c.only_b else ""))
    h = (f"<h2>{html.escape(c.label_b)} (B) vs {html.escape(c.label_a)} (A)</h2>"
         f"<p>A: <code>{html.escape(str(c.a.path.resolve()))}</code><br>B: <code>{html.escape(str(c.b.path.resolve()))}</code></p>"
         + (f"<p>{html.escape(c.intersection_note)}</p>" if c.intersection_note else ""))
    return md, h


def write_comparison(comparisons: list[Comparison], out_dir: str | Path) -> dict[str, Path]:
    """compare.md and compare.html in ``out_dir``; returns their paths."""
    out = Path(out_dir)
    md = ["# adjcap compare\n", "Each later run (B) against the first (A): B - A with a paired bootstrap interval.\n"]
    body = ["<h1>adjcap compare</h1>",
            "<p>Each later run (B) against the first (A): B - A with a paired bootstrap interval.</p>"]
    for c in comparisons:
        h_md, h_html = _header(c)
        md.append(h_md)
        body.append(h_html)
        for tab in _tables(c):
            if not tab.rows and tab.title.startswith(("config", "provenance")):
                md.append(f"**{tab.title}**: nothing\n")
                body.append(f"<p><b>{html.escape(tab.title)}</b>: nothing</p>")
                continue
            md.append(tab.to_markdown())
            body.append(tab.to_html())
    page = html_page("adjcap compare", "\n".join(body))
    return {"markdown": atomic_write_text(out / "compare.md", "\n".join(md)),
            "html": atomic_write_text(out / "compare.html", page)}


def compare(run_dirs: list[str | Path], out_dir: str | Path | None = None, *,
            intersection: bool = False) -> tuple[list[Comparison], dict[str, Path]]:
    """Every later run against the first; compare.md / compare.html in ``out_dir`` (default: the
    current directory)."""
    if len(run_dirs) < 2:
        raise ValueError("compare: give at least two run directories (RUN_A RUN_B [...])")
    runs = []
    for p in run_dirs:
        path = Path(p)
        if not path.is_dir():
            raise NotComparable(f"{path}: not a directory")
        run = load_run(path)
        if not run.metrics:
            raise NotComparable(f"{path}: no metrics/<protocol>.json; is it a run directory? (run `adjcap evaluate "
                                f"--run {path}` first)")
        runs.append(run)
    labels = _labels(runs)
    comps = [compare_runs(runs[0], r, intersection=intersection, label_a=labels[0], label_b=lab)
             for r, lab in zip(runs[1:], labels[1:])]
    return comps, write_comparison(comps, Path(out_dir) if out_dir is not None else Path.cwd())


def _labels(runs: list[RunData]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for r in runs:
        seen[r.name] = seen.get(r.name, 0) + 1
        out.append(r.name if seen[r.name] == 1 else f"{r.name}-{seen[r.name]}")
    return out

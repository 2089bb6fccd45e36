"""The demo's figures, one source for the documentation (README.md, docs/guide/demo.md), BENCHMARKS.md
and the tests.

``make demo`` computes with portable numerics (:mod:`adjcap.machine.numerics`), so its tiny models and its
predictions are the same bits on every x86-64 CPU with AVX2. ``expected.json`` beside this module
records what they are: each tiny model's digest (:func:`adjcap.demo.tiny.model_digests`), each picker's
predictions digest, the headline figures (LM-only against every picker, CIDEr and CHAIR_i with paired
bootstrap intervals) and the judges' held-out quality. ``python benchmarks/demo_figures.py`` writes
it from a fresh ``make demo`` and rewrites the marked blocks of the documents of :data:`BLOCKS` from it;
``tests/test_demo_portable.py`` checks a fresh build and run against it and the documents against it.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

EXPECTED = Path(__file__).with_name("expected.json")
PROTOCOL = "inductive"
PICKER_LABELS = {"ensemble": "ensemble", "trifuse": "TriFuse", "memattend": "MemAttend", "fixed": "fixed",
                 "verifier": "verifier", "retrieval": "retrieval"}


def prediction_digests(run_dir: str | Path, protocol: str = PROTOCOL) -> dict[str, str]:
    """Per picker, sha256 (16 hex digits) of its ``image_id<TAB>caption`` lines in image-id order."""
    out = {}
    for path in sorted((Path(run_dir) / "predictions" / protocol).glob("*.json")):
        rows = sorted((r["image_id"], r["caption"]) for r in json.loads(path.read_text()))
        out[path.stem] = hashlib.sha256("".join(f"{i}\t{c}\n" for i, c in rows).encode()).hexdigest()[:16]
    return out


def _interval(d) -> dict[str, float]:
    return {"a": round(d.a, 1), "b": round(d.b, 1), "delta": round(d.delta, 1), "low": round(d.low, 1),
            "high": round(d.high, 1)}


def headline(run_dir: str | Path, protocol: str = PROTOCOL) -> dict[str, dict[str, dict[str, float]]]:
    """Per picker, CIDEr and CHAIR_i of LM-only (``a``) and the picker (``b``), the difference and its
    paired bootstrap 95% interval, rounded as the report prints them."""
    from adjcap.report.collect import load_run
    from adjcap.report.headline import picker_differences

    run = load_run(run_dir)
    out = {}
    for picker in PICKER_LABELS:
        diffs = picker_differences(run, protocol, picker)
        out[picker] = {k: _interval(d) for k, d in diffs.items() if d is not None}
    return out


def measure(run_dir: str | Path, tiny_root: str | Path) -> dict[str, Any]:
    """Everything ``expected.json`` holds, measured on a finished demo run and its tiny models."""
    from adjcap.demo.tiny import QUALITY, model_digests

    q = json.loads((Path(tiny_root) / QUALITY).read_text())
    n = len(json.loads((Path(run_dir) / "predictions" / PROTOCOL / "lm.json").read_text()))
    return {"tiny_models": model_digests(Path(tiny_root)), "predictions": prediction_digests(run_dir),
            "test_images": n, "headline": headline(run_dir),
            "quality": {"retrieval_r1": round(q["retrieval_clip"]["i2t_r@1"], 2),
                        "retrieval_r5": round(q["retrieval_clip"]["i2t_r@5"], 2),
                        "captioner_r1": round(q["captioner_clip"]["i2t_r@1"], 2),
                        "captioner_r5": round(q["captioner_clip"]["i2t_r@5"], 2),
                        "itm_accuracy": round(q["blip_itm"]["accuracy"], 2),
                        "itm_swap": round(q["blip_itm"]["pairwise_swap"], 2),
                        "held_out": q["images"]}}


def expected() -> dict[str, Any]:
    return json.loads(EXPECTED.read_text())


# ---- the documents' blocks ---------------------------------------------------------------------


def _signed(x: float) -> str:
    return f"{x:+.1f}"


def _ci(d: dict[str, float]) -> str:
    return f"[{_signed(d['low'])}, {_signed(d['high'])}]"


def demo_page_block(e: dict[str, Any]) -> str:
    """docs/guide/demo.md's paragraph on the demo's headline (between ``<!-- demo-figures -->`` markers)."""
    h, q = e["headline"], e["quality"]
    ens = h["ensemble"]
    c, ch = ens["CIDEr"], ens["CHAIR_i"]
    excl_c = [label for p, label in PICKER_LABELS.items() if h[p]["CIDEr"]["low"] > 0 or h[p]["CIDEr"]["high"] < 0]
    excl_h = [label for p, label in PICKER_LABELS.items() if h[p]["CHAIR_i"]["high"] < 0]
    best = max(PICKER_LABELS, key=lambda p: h[p]["CIDEr"]["b"])
    lines = [
        f"On the built world (seed 42; the same numbers on every x86-64 CPU with AVX2, see *Portable numerics*) "
        f"the ensemble lifts CIDEr from {c['a']:.1f} to {c['b']:.1f} ({_signed(c['delta'])}, 95% CI {_ci(c)}) and "
        f"moves CHAIR_i from {ch['a']:.1f}% to {ch['b']:.1f}% ({_signed(ch['delta'])}, CI {_ci(ch)}), over "
        f"{e['test_images']} test images.",
        f"Pickers whose CIDEr interval excludes zero: {', '.join(excl_c) or 'none'}; whose CHAIR_i interval is "
        f"below zero: {', '.join(excl_h) or 'none'}.",
        f"The highest CIDEr is {PICKER_LABELS[best]}'s ({h[best]['CIDEr']['b']:.1f}). Judges on {q['held_out']} "
        f"held-out scenes: retrieval CLIP recall@1/5 {q['retrieval_r1']:.2f}/{q['retrieval_r5']:.2f} (captioner "
        f"CLIP {q['captioner_r1']:.2f}/{q['captioner_r5']:.2f}), BLIP ITM accuracy {q['itm_accuracy']:.2f} "
        f"({q['itm_swap']:.2f} on one-word swaps).",
    ]
    return "\n".join(lines)


def benchmarks_block(e: dict[str, Any]) -> str:
    """BENCHMARKS.md's table of the demo's headline (between ``<!-- demo-figures -->`` markers)."""
    h = e["headline"]
    lm = h["ensemble"]
    rows = ["| picker | CIDEr | delta | 95% CI | CHAIR_i % | delta | 95% CI |", "|---|---:|---:|---|---:|---:|---|",
            f"| LM-only (IFCap) | {lm['CIDEr']['a']:.1f} | | | {lm['CHAIR_i']['a']:.1f} | | |"]
    for p, label in PICKER_LABELS.items():
        c, ch = h[p]["CIDEr"], h[p]["CHAIR_i"]
        rows.append(f"| {label} | {c['b']:.1f} | {_signed(c['delta'])} | {_ci(c)} | {ch['b']:.1f} | "
                    f"{_signed(ch['delta'])} | {_ci(ch)} |")
    rows.append("")
    rows.append("Digests (`adjcap/demo/expected.json`): tiny models "
                + ", ".join(f"{k} `{v}`" for k, v in sorted(e["tiny_models"].items()))
                + "; predictions " + ", ".join(f"{k} `{v}`" for k, v in sorted(e["predictions"].items())) + ".")
    return "\n".join(rows)


def readme_block(e: dict[str, Any]) -> str:
    """README.md's first-screen sentence on what the demo shows (between ``<!-- demo-figures -->`` markers)."""
    c, ch = e["headline"]["ensemble"]["CIDEr"], e["headline"]["ensemble"]["CHAIR_i"]
    return (f"**What `make demo` shows** (a synthetic world, tiny models, a CPU; the same numbers on every x86-64 "
            f"CPU with AVX2): over IFCap's own pick, the adjudicated ensemble lifts CIDEr from {c['a']:.1f} to "
            f"{c['b']:.1f} ({_signed(c['delta'])}, 95% CI {_ci(c)}) and moves CHAIR_i from {ch['a']:.1f}% to "
            f"{ch['b']:.1f}% ({_signed(ch['delta'])}, CI {_ci(ch)}) on {e['test_images']} test images.")


BLOCKS = {"docs/guide/demo.md": demo_page_block, "BENCHMARKS.md": benchmarks_block, "README.md": readme_block}
_MARK = "<!-- demo-figures: generated by benchmarks/demo_figures.py from adjcap/demo/expected.json -->"
_END = "<!-- /demo-figures -->"


def block_in(text: str) -> str | None:
    """The generated block of a document (None when it has none)."""
    m = re.search(re.escape(_MARK) + r"\n(.*?)\n" + re.escape(_END), text, re.S)
    return m.group(1) if m else None


def with_block(text: str, body: str) -> str:
    if block_in(text) is None:
        raise ValueError(f"no {_MARK} ... {_END} block to replace")
    return re.sub(re.escape(_MARK) + r"\n.*?\n" + re.escape(_END), lambda _: f"{_MARK}\n{body}\n{_END}", text,
                  count=1, flags=re.S)

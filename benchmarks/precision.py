"""How much the speed mode (``--set precision=bf16``) changes what a run computes, against the paper's
fp32: per stage, how many images retrieve other captions, keep other verified captions, decode another
beam; per picker, how many picks change, the metric deltas of each picker, and CIDEr's and CHAIR_i's
change with a paired 95% bootstrap interval over the images (adjcap.metrics.bootstrap).

    python benchmarks/precision.py --limit 8                 # the demo world on this machine (CPU: slow in bf16)
    python benchmarks/precision.py --limit 200 --device cuda # on a GPU
    python benchmarks/precision.py --preset gpu --limit 8    # the gpu speed preset against the headline's fp32
    python benchmarks/precision.py --preset gpu --limit 8 --set precision=none \
        --set retrieval.encoder.precision=bf16 --set verifier.precision=bf16 --set eval.clipscore.precision=bf16 \
        --set captioner.clip.precision=fp32
                                 # one setting's share: the gpu preset as is against it with the captioner's
                                 # CLIP in fp32 (the root precision would override a section's: refused)

bf16 here is the root switch: the retrieval, output-scorer and CLIPScore encoders, the verifier and the
captioner's CLIP; the captioner's GPT-2 stays fp32 (``captioner.precision``). With ``--preset gpu`` the
two runs are the headline and the gpu preset on the demo world (``jobs.demo.on_demo_world``: the same
method and tiny models; the gpu preset adds bf16, TF32 (a GPU's only), token-budget text batches and
SDPA vision attention), so the table is the gpu preset's parity. Results: BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from adjcap.config import apply_override, load_config, validate_config  # noqa: E402
from adjcap.engine.features import rows_to_table  # noqa: E402
from adjcap.metrics.bootstrap import paired_bootstrap, resample_indices, statistic_matrices  # noqa: E402
from adjcap.metrics.evaluate import Evaluator  # noqa: E402
from adjcap.engine.pipeline import run_pipeline  # noqa: E402
from adjcap.rerank import applicable_pickers, load_features, pick, run_protocol  # noqa: E402
from adjcap.jobs.demo import on_demo_world, prepare  # noqa: E402
from adjcap.engine.run_plan import read_records  # noqa: E402


def extract(cfg, records) -> tuple[dict, float]:
    t = time.perf_counter()
    tables = {split: rows_to_table(run_pipeline(recs, cfg)) for split, recs in records.items()}
    return tables, time.perf_counter() - t


def picks(cfg, tables) -> dict[str, dict[str, int]]:
    """Every applicable picker's choice on the apply split, {picker: {image_id: candidate index}}."""
    res = run_protocol(cfg, tables)
    feats = load_features(tables[cfg.rerank.apply_split], lm_feature=cfg.scorer.lm_feature)
    out = {}
    for name in applicable_pickers(feats, res.heads):
        idx = pick(feats, name, res.heads, alpha=res.alpha, beta=res.beta)
        out[name] = {iid: int(i) for iid, i in zip(feats.image_ids, idx)}
    return out


def paired_intervals(per_a: dict, per_b: dict, metrics=("CIDEr", "CHAIR_i")) -> dict:
    """bf16 minus fp32 of each metric with its paired 95% bootstrap interval over the same images
    (adjcap.metrics.bootstrap, one resampling for both metrics)."""
    ids = sorted(set(per_a) & set(per_b))
    draws = resample_indices(len(ids))
    out = {}
    for name in metrics:
        st, xa, xb = statistic_matrices(name, per_a, per_b, ids)
        if xa is None or xb is None:
            out[name] = None
            continue
        d = paired_bootstrap(xa, xb, st.statistic, indices=draws)
        out[name] = {"fp32": d.a, "bf16": d.b, "delta": d.delta, "low": d.low, "high": d.high,
                     "excludes_zero": d.excludes_zero}
    return out


def changed(a: list[dict], b: list[dict], field) -> int:
    return sum(field(x) != field(y) for x, y in zip(a, b))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=8, help="images per split")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--cache", default=None, help="demo cache (default: $ADJCAP_CACHE or a temp dir)")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--preset", default=None, choices=["gpu"],
                    help="compare this speed preset with the headline's fp32 on the demo world (default: the demo "
                         "preset with precision=bf16 against fp32)")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="with --preset: compare the preset as is (first) with the preset and these settings "
                         "(second), e.g. the captioner's CLIP in fp32 (see the module's docstring): what that model in bf16 moves")
    args = ap.parse_args()
    if args.sets and args.preset is None:
        ap.error("--set needs --preset (the preset as is is the first run)")
    # the two runs' names: fp32 against bf16, or the preset against the preset with --set
    first, second = ("fp32", "bf16") if not args.sets else (args.preset, f"{args.preset}+" + ",".join(args.sets))
    cache = args.cache or os.environ.get("ADJCAP_CACHE") or tempfile.mkdtemp(prefix="adjcap-precision-")
    sets = [f"paths.cache_dir={cache}", f"device={args.device}", f"limit={args.limit}"]
    base = load_config("demo", sets)
    prepare(base)

    def config(prec: str):
        if args.preset is None:
            return load_config("demo", [*sets, f"precision={prec}"]).resolved()
        if args.sets:  # the preset as is, then with --set (after the demo world's sections); both on the demo world
            data = on_demo_world(load_config(args.preset, sets)).model_dump(mode="json")
            for assignment in args.sets if prec == second else []:
                apply_override(data, assignment)
            return validate_config(data).resolved()
        # "fp32": the headline's fidelity settings; "bf16": the speed preset's; both on the demo world
        return on_demo_world(load_config("headline" if prec == "fp32" else args.preset, sets)).resolved()

    runs = {}
    for prec in (first, second):
        cfg = config(prec)
        records = read_records(cfg)
        tables, seconds = extract(cfg, records)
        runs[prec] = {"cfg": cfg, "records": records, "tables": tables, "seconds": seconds, "picks": picks(cfg, tables)}
        print(f"{prec}: features for {sum(len(r) for r in records.values())} images in {seconds:.1f}s")

    a, b = runs[first], runs[second]
    split = a["cfg"].rerank.apply_split
    ra, rb = a["tables"][split].to_pylist(), b["tables"][split].to_pylist()
    n = len(ra)
    stage = {
        "retrieved (top-L ids)": changed(ra, rb, lambda r: [x["corpus_id"] for x in r["retrieved"]]),
        "verified (kept ids, order)": changed(ra, rb, lambda r: [x["corpus_id"] for x in r["verified"]]),
        "beam (candidate texts)": changed(ra, rb, lambda r: [x["text"] for x in r["candidates"]]),
    }
    max_cos = max((abs(x["retrieval_cosine"] - y["retrieval_cosine"])
                   for p, q in zip(ra, rb) if [c["text"] for c in p["candidates"]] == [c["text"] for c in q["candidates"]]
                   for x, y in zip(p["candidates"], q["candidates"])), default=math.nan)
    refs = {r.image_id: list(r.references) for r in a["records"][split]}
    texts = {prec: {row["image_id"]: [c["text"] for c in row["candidates"]] for row in runs[prec]["tables"][split].to_pylist()}
             for prec in runs}
    result = {"images": n, "device": args.device, "runs": [first, second], "stage_changes": stage, "max_abs_cosine_diff_same_beam": max_cos,
              "seconds": {p: runs[p]["seconds"] for p in runs}, "pickers": {}}
    with Evaluator(refs) as ev:
        for name in sorted(set(a["picks"]) & set(b["picks"])):
            pa_, pb_ = a["picks"][name], b["picks"][name]
            cap_a = {i: texts[first][i][k] for i, k in pa_.items()}
            cap_b = {i: texts[second][i][k] for i, k in pb_.items()}
            sa, sb = ev.score(cap_a), ev.score(cap_b)
            ma, mb = sa["metrics"], sb["metrics"]
            result["pickers"][name] = {
                "picks_changed": sum(cap_a[i] != cap_b[i] for i in cap_a),
                "picks_changed_share": sum(cap_a[i] != cap_b[i] for i in cap_a) / max(1, len(cap_a)),
                f"CIDEr_{first}": ma.get("CIDEr"), f"CIDEr_{second}": mb.get("CIDEr"),
                "delta": {k: (mb[k] - ma[k]) for k in ma if ma.get(k) is not None and mb.get(k) is not None},
                "paired_95": paired_intervals(sa["per_image"], sb["per_image"]),
            }
    what = (f"{second} vs {first}" if args.sets else
            f"the {args.preset} preset vs the headline's fp32" if args.preset else "bf16 vs fp32")
    print(f"\n{n} images of '{split}' on {args.device}; {what}")
    for k, v in stage.items():
        print(f"  {k:28s} changed on {v}/{n} images")
    print(f"  max |cosine diff| where the beam is unchanged: {max_cos:.2e}")
    print(f"  {'picker':10s} {'picks changed':>14s} {'CIDEr 1st':>11s} {'CIDEr 2nd':>11s} {'dB-4':>6s} {'dCIDEr':>7s}")
    for name, p in result["pickers"].items():
        d = p["delta"]
        print(f"  {name:10s} {p['picks_changed']:>9d}/{n:<4d} {p[f'CIDEr_{first}']:>11.2f} {p[f'CIDEr_{second}']:>11.2f} "
              f"{d.get('B-4', math.nan):>6.2f} {d.get('CIDEr', math.nan):>7.2f}")
    for name, p in result["pickers"].items():
        for metric, d in p["paired_95"].items():
            if d:
                print(f"  {name:10s} {metric:8s} {d['delta']:+.2f} [{d['low']:+.2f}, {d['high']:+.2f}] (paired 95%)")
    result["command"] = " ".join(["python", *sys.argv])
    result["tf32_in_effect"] = False if args.device == "cpu" else None  # TF32 is a CUDA tensor-core mode
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()

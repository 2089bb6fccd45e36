"""The per-sample table of a run: ``samples.parquet`` (one row per image and split) and its dataset
card ``samples.md`` (:class:`adjcap.storage.rundir.RunDir` owns both paths).

A row holds everything the run knows about one image: its id, split, path under the benchmark's image
root, references, the stages' outputs (retrieved and verified captions, entities, prompt), every beam
candidate with every judge's score and its beam rank, and - on the split the pickers were applied to -
each picker's pick per protocol with that pick's per-image metrics (CIDEr, BLEU-4, METEOR, ROUGE-L,
SPICE when run, CLIPScore, the CHAIR proxy's mentioned and hallucinated objects), or the error that
stopped the image. It is built from the run's own files (features, references, predictions,
metrics); a protocol's metrics are used only when they are not older than its predictions (after a
new ``adjcap fit`` and before ``adjcap evaluate`` the picks are there, their metrics are null).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from adjcap.engine.features import CANDIDATE, RETRIEVED, VERIFIED
from adjcap.storage.io import atomic_write_parquet, atomic_write_text
from adjcap.storage.rundir import RunDir

# per-image metric columns of a pick: (field, key in metrics/<protocol>.json per_image)
PICK_METRICS = (("cider", "CIDEr"), ("bleu_4", "B-4"), ("meteor", "METEOR"), ("rouge_l", "ROUGE-L"),
                ("spice", "SPICE"), ("clipscore", "CLIPScore"))

PICK = pa.struct([
    ("protocol", pa.string()),
    ("picker", pa.string()),
    ("candidate_index", pa.int32()),  # index into `candidates`; null when the prediction names none
    ("caption", pa.string()),
    *((name, pa.float64()) for name, _ in PICK_METRICS),
    ("chair_mentioned", pa.list_(pa.string())),
    ("chair_hallucinated", pa.list_(pa.string())),
])

SAMPLES_SCHEMA = pa.schema([
    ("image_id", pa.string()),
    ("benchmark", pa.string()),
    ("split", pa.string()),
    ("image_path", pa.string()),
    ("domain", pa.string()),
    ("error", pa.string()),
    ("references", pa.list_(pa.string())),
    ("retrieved", pa.list_(RETRIEVED)),
    ("verified", pa.list_(VERIFIED)),
    ("entities", pa.list_(pa.string())),
    ("prompt", pa.string()),
    ("candidates", pa.list_(CANDIDATE)),
    ("picks", pa.list_(PICK)),
])

FIELDS = {
    "image_id": "the image's id in the benchmark (the file name where the layout has one)",
    "benchmark": "the benchmark name of the run (coco, flickr30k, nocaps, demo, folder, ...)",
    "split": "the split the image belongs to (test, val, ...); one row per image and split",
    "image_path": "the image file relative to the benchmark's image root (null when unknown)",
    "domain": "NoCaps in-/near-/out-domain; null elsewhere",
    "error": "why the image failed (decode, a stage); null when it went through every stage",
    "references": "the reference captions of the image",
    "retrieved": "stage 1: the L corpus captions retrieved {corpus_id, text, cosine, verifier}",
    "verified": "stage 2: the k captions the verifier kept {corpus_id, text, verifier, retrieval_rank}",
    "entities": "the entities the filter kept", "prompt": "the captioner's hard prompt",
    "candidates": "stage 3-4: the beam of N candidates with every judge's score {text, lm_logprob_sum, "
                  "lm_logprob_mean, n_tokens, beam_rank (0 = the beam's own first choice), retrieval_cosine "
                  "(output scorer), verifier (ITM probability), clipscore_cosine (CLIPScore encoder)}",
    "picks": "on the split the pickers were applied to: one entry per protocol and picker {protocol, picker, "
             "candidate_index (into candidates), caption, cider, bleu_4, meteor, rouge_l, spice (x100; null = "
             "not computed), clipscore (w=2.5), chair_mentioned, chair_hallucinated (COCO classes, reference-"
             "proxy CHAIR)}; empty on other splits",
}


def _fresh_metrics(run: RunDir, protocol: str) -> dict[str, Any] | None:
    """metrics/<protocol>.json when it is not older than the protocol's predictions."""
    if not run.metrics_current(protocol):
        return None
    import json

    return json.loads(run.metrics_path(protocol).read_text(encoding="utf-8"))


def _chair_objects(picks: Mapping[tuple[str, str], str], references: Mapping[str, list[str]]) -> dict:
    """(image id, caption) -> {"mentioned", "hallucinated"}: each distinct pick scored once."""
    from adjcap.metrics.chair import ChairMatcher, chair_proxy

    preds = {k: cap for k, cap in picks.items() if references.get(k[0])}
    if not preds:
        return {}
    refs = {k: references[k[0]] for k in preds}
    return chair_proxy(preds, refs, matcher=ChairMatcher()).per_image


def build_samples(run: RunDir, image_paths: Mapping[tuple[str, str], str | None] | None = None,
                  image_root: str | Path | None = None) -> pa.Table:
    """The run's samples table (see the module docstring). ``image_paths``: (split, image id) ->
    the image file (absolute, or relative to ``image_root``), as the benchmark reader gave it; images
    not in it keep the path an earlier samples.parquet recorded."""
    bench_cfg, apply_split = run.settings()
    splits = [(b, s) for b, s in run.reference_splits() if bench_cfg is None or b == bench_cfg]
    old_paths = _old_paths(run)
    root = Path(image_root).resolve() if image_root else None

    # picks and their metrics, per protocol (apply split only)
    picks: dict[str, list[dict[str, Any]]] = {}
    chair_in: dict[tuple[str, str], str] = {}
    for proto in run.prediction_protocols():
        metrics = _fresh_metrics(run, proto) or {}
        per_image = metrics.get("per_image") or {}
        for picker, path in run.prediction_files(proto).items():
            scored = per_image.get(picker) or {}
            for e in run.predictions(proto, picker):
                iid = str(e.get("image_id"))
                ci = e.get("candidate_index")
                m = scored.get(iid) or {}
                entry = {"protocol": proto, "picker": picker,
                         "candidate_index": ci if isinstance(ci, int) and not isinstance(ci, bool) and ci >= 0 else None,
                         "caption": e.get("caption"),
                         **{name: m.get(key) for name, key in PICK_METRICS},
                         "chair_mentioned": None, "chair_hallucinated": None}
                if m:  # scored: its CHAIR objects too
                    chair_in[(iid, entry["caption"])] = entry["caption"]
                picks.setdefault(iid, []).append(entry)

    rows: list[dict[str, Any]] = []
    refs_apply: dict[str, list[str]] = {}
    for bench, split in splits:
        refs = run.references(bench, split)
        domains = run.domains(bench, split) or {}
        feats: dict[str, dict[str, Any]] = {}
        if run.has_features(bench, split):
            table = run.read_features(bench, split, image_ids=set(refs))
            for r in table.to_pylist():
                feats[str(r["image_id"])] = r
        if split == apply_split:
            refs_apply = {k: list(v) for k, v in refs.items()}
        for iid in refs:
            f = feats.get(iid, {})
            path = _relative((image_paths or {}).get((split, iid)), root)
            if path is None:
                path = old_paths.get((split, iid))
            rows.append({
                "image_id": iid, "benchmark": bench, "split": split, "image_path": path,
                "domain": domains.get(iid) or f.get("domain"),
                "error": f.get("error") if f else ("no feature row (not extracted yet)" if feats else None),
                "references": list(refs[iid]),
                "retrieved": f.get("retrieved"), "verified": f.get("verified"), "entities": f.get("entities"),
                "prompt": f.get("prompt"), "candidates": f.get("candidates"),
                "picks": picks.get(iid, []) if split == apply_split else [],
            })
    objects = _chair_objects(chair_in, refs_apply)
    for row in rows:
        for p in row["picks"]:
            o = objects.get((row["image_id"], p["caption"]))
            if o is not None and p["cider"] is not None:
                p["chair_mentioned"], p["chair_hallucinated"] = o["mentioned"], o["hallucinated"]
    return pa.Table.from_pylist(rows, schema=SAMPLES_SCHEMA)


def _relative(path: str | None, root: Path | None) -> str | None:
    if not path:
        return None
    p = Path(path)
    if root is not None and p.is_absolute():
        try:
            return str(p.resolve().relative_to(root))
        except ValueError:
            return os.path.relpath(p.resolve(), root)
    return str(p)


def _old_paths(run: RunDir) -> dict[tuple[str, str], str]:
    p = run.samples_path
    if not p.exists():
        return {}
    try:
        t = pq.read_table(p, columns=["split", "image_id", "image_path"])
    except Exception:  # noqa: BLE001 - an unreadable old table is simply rebuilt
        return {}
    return {(s, i): ip for s, i, ip in zip(*(t.column(c).to_pylist() for c in ("split", "image_id", "image_path")))
            if ip}


def write_samples(run: RunDir, image_paths: Mapping[tuple[str, str], str | None] | None = None,
                  image_root: str | Path | None = None) -> Path:
    """Build and write ``samples.parquet`` and its card ``samples.md``; returns the table's path."""
    table = build_samples(run, image_paths, image_root)
    path = atomic_write_parquet(run.samples_path, table)
    atomic_write_text(run.samples_card_path, card(table, image_root))
    return path


def read_samples(run: RunDir) -> pa.Table:
    """``samples.parquet`` when it is there, else the same table built from the run's files."""
    if run.samples_path.exists():
        try:
            return pq.read_table(run.samples_path)
        except Exception:  # noqa: BLE001 - a damaged table is rebuilt from the files it came from
            pass
    return build_samples(run)


def card(table: pa.Table, image_root: str | Path | None = None) -> str:
    """The dataset card: what the table holds, its fields, and how to load it."""
    splits: dict[str, int] = {}
    for s in table.column("split").to_pylist():
        splits[s] = splits.get(s, 0) + 1
    errors = sum(1 for e in table.column("error").to_pylist() if e)
    pairs = sorted({(p["protocol"], p["picker"]) for ps in table.column("picks").to_pylist() for p in ps or []})
    protos: dict[str, list[str]] = {}
    for proto, picker in pairs:
        protos.setdefault(proto, []).append(picker)
    lines = [
        "# samples.parquet",
        "",
        "One row per image and split of this run: references, every beam candidate with every judge's score, "
        "every picker's pick per protocol with its per-image metrics, and the error when the image failed. "
        "Written by adjcap (run-job, fit, evaluate); rebuilt from the run's files whenever they change.",
        "",
        f"- rows: {table.num_rows} ({', '.join(f'{s}: {n}' for s, n in splits.items()) or 'none'}); "
        f"failed images: {errors}",
        f"- image root: {image_root or 'the benchmark images folder of config.toml'}",
        "- pickers per protocol: " + ("; ".join(f"{k}: {', '.join(v)}" for k, v in protos.items()) or "none yet"),
        "",
        "## Fields",
        "",
        "| field | type | meaning |",
        "|---|---|---|",
    ]
    for f in SAMPLES_SCHEMA:
        lines.append(f"| `{f.name}` | {_type_name(f.type)} | {FIELDS.get(f.name, '')} |")
    lines += [
        "",
        "## Loading",
        "",
        "```python",
        "import pandas as pd",
        "df = pd.read_parquet('samples.parquet')",
        "picks = df.explode('picks').dropna(subset=['picks'])",
        "picks = pd.concat([picks.drop(columns='picks').reset_index(drop=True),",
        "                   pd.json_normalize(picks['picks'].tolist())], axis=1)",
        "# images where the ensemble changed the LM's pick (inductive protocol)",
        "p = picks[picks.protocol == 'inductive'].pivot(index='image_id', columns='picker', values='candidate_index')",
        "changed = p[p['ensemble'] != p['lm']]",
        "",
        "from datasets import load_dataset  # Hugging Face datasets",
        "ds = load_dataset('parquet', data_files='samples.parquet')['train']",
        "```",
        "",
    ]
    return "\n".join(lines)


def _type_name(t: pa.DataType) -> str:
    if pa.types.is_list(t):
        return f"list of {_type_name(t.value_type)}"
    if pa.types.is_struct(t):
        return "struct"
    return str(t)


def candidates_of(table: pa.Table) -> list[dict[str, Any]]:
    """A run's candidates as a candidates file's rows (:mod:`adjcap.data.candidates`): per image (once,
    whatever its splits), its candidates in the run's order with their log-prob sums, token counts and
    means, so that ``--candidates`` adjudicates exactly what the run did. Failed images are left out; a
    text the beam holds twice (two token sequences decoding alike: rare) is kept once, at its first place
    (a candidates file repeating a candidate is refused)."""
    out, seen = [], set()
    for row in table.select(["image_id", "error", "candidates"]).to_pylist():
        if row["error"] is not None or not row["candidates"] or row["image_id"] in seen:
            continue
        seen.add(row["image_id"])
        seen: set[str] = set()
        cands = [c for c in row["candidates"] if not (c["text"] in seen or seen.add(c["text"]))]
        out.append({"image": row["image_id"], "candidates": [c["text"] for c in cands],
                    "logprobs": [c["lm_logprob_sum"] for c in cands], "n_tokens": [c["n_tokens"] for c in cands],
                    "logprob_means": [c["lm_logprob_mean"] for c in cands]})
    return out

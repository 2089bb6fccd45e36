"""On the driver: read a run's feature tables, run the configured protocol (fit the heads when it
learns), and write one COCO-results predictions file per picker into predictions/<protocol>/.

Besides the configured picker, the same beam dump is also picked by the LM alone (IFCap's own pick),
each frozen scorer alone and the fixed fusion, and - when heads were fit - TriFuse and MemAttend
alone, so the report can show the paper's ablation rows side by side. A picker whose inputs are
absent (e.g. ``verifier`` on a run without a verifier) is skipped and listed under
``not_applicable`` in fit/<protocol>.json."""

from __future__ import annotations

import json
from pathlib import Path

from adjcap.config import Config
from adjcap.io import atomic_write_json
from adjcap.rerank import applicability, load_features, pick, run_protocol, save_heads
from jobs.run_benchmark import features_dir, read_features


def _coco_ids(run_dir: Path, cfg: Config, split: str) -> dict[str, int]:
    p = run_dir / "references" / f"{cfg.benchmark}-{split}.coco_ids.json"
    return json.loads(p.read_text()) if p.exists() else {}


def main(cfg: Config, run_dir: Path) -> dict:
    run_dir = Path(run_dir)
    r = cfg.rerank
    needed = {r.apply_split}
    if r.protocol == "inductive" or r.select:
        needed.add(r.fit_split)
    tables = {}
    for split in sorted(needed):
        if not features_dir(run_dir, cfg.benchmark, split).exists():
            raise FileNotFoundError(
                f"{features_dir(run_dir, cfg.benchmark, split)} is missing: protocol '{r.protocol}' needs the "
                f"'{split}' split; add it to `splits` (e.g. --set 'splits=[\"val\",\"test\"]') and rerun run-job"
            )
        tables[split] = read_features(run_dir, cfg.benchmark, split)
    result = run_protocol(cfg, tables)
    if result.heads is not None:
        save_heads(run_dir / "heads", result.heads, meta=result.summary())

    apply = load_features(tables[r.apply_split], lm_feature=cfg.scorer.lm_feature,
                          memory_tokens=r.memattend.memory_tokens)
    status = applicability(apply, result.heads)  # picker -> None (applicable) or why not
    pickers = [name for name, why in status.items() if why is None]
    not_applicable = {name: why for name, why in status.items() if why is not None}
    atomic_write_json(run_dir / "fit" / f"{r.protocol}.json", {**result.summary(), "not_applicable": not_applicable})
    if r.picker not in pickers:
        pickers.append(r.picker)
    coco_ids = _coco_ids(run_dir, cfg, r.apply_split)
    out_dir = run_dir / "predictions" / r.protocol
    written = {}
    for name in pickers:
        if name == r.picker:
            chosen = {iid: (p.index, p.caption) for iid, p in result.picks[r.apply_split].items()}
        else:
            idx = pick(apply, name, result.heads, alpha=result.alpha, beta=result.beta)
            chosen = {iid: (int(i), apply.texts[k][int(i)]) for k, (iid, i) in enumerate(zip(apply.image_ids, idx))}
        entries = []
        for iid, (i, caption) in chosen.items():
            e = {"image_id": iid, "caption": caption, "candidate_index": i}
            if iid in coco_ids:
                e["coco_id"] = coco_ids[iid]
            entries.append(e)
        path = out_dir / f"{name}.json"
        atomic_write_json(path, entries)
        written[name] = str(path)
    print(f"fit: protocol {r.protocol}, picker {r.picker}"
          + (f", heads fit on {result.n_fit_images} images of '{result.fit_split}'" if result.heads is not None else "")
          + f"; predictions for {len(written)} pickers in {out_dir}"
          + (f"; not applicable: {', '.join(f'{n} ({w})' for n, w in not_applicable.items())}" if not_applicable else ""))
    return written

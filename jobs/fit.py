"""The fit step: read a run's feature tables, run the configured protocol (fitting the heads when it
learns), and write one COCO-results predictions file per applicable picker into
``predictions/<protocol>/``.

Besides the configured picker, the same beam dump is also picked by the LM alone (IFCap's own pick),
each frozen scorer alone and the fixed fusion, and - when heads were fit - TriFuse and MemAttend
alone, so the report can show the paper's ablation rows side by side. With ``rerank.seeds``, each
learned picker is also written once per seed (``predictions/<protocol>/seeds/``, the heads of each
seed in ``heads/seeds/<seed>/``): the seed study the evaluation summarises. A picker whose inputs are
absent (e.g. ``verifier`` on a run without a verifier) is skipped and listed under
``not_applicable`` in fit/<protocol>.json.

Heads fitted elsewhere (``adjcap fit --run B --heads A/heads``: fit on one benchmark, apply to
another) are applied instead of fitting; only the apply split is then read, and the heads are saved
into this run with a note of where they came from.

Where the fit runs: ``rerank.device`` (auto) picks CUDA when a GPU is there - inside a Ray session, a
Ray task holding one GPU of the cluster; outside one, this machine's GPU; otherwise this CPU."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ray
import torch

from adjcap.config import Config, load_config
from adjcap.engine.identity import feature_identity
from adjcap.rerank import (Heads, applicability, fit_device, get_picker, load_features, load_heads, pick, run_protocol,
                           save_heads)
from adjcap.storage.rundir import RunDir
from adjcap.report.tracking import log_run, parse_log_specs
from adjcap.jobs.evaluate import write_samples
from adjcap.jobs.provenance_record import note_step
from adjcap.jobs.executors import on_ray
from adjcap.jobs.ray_session import has_gpus


def needed_splits(cfg: Config, heads_given: bool = False) -> list[str]:
    r = cfg.rerank
    needed = {r.apply_split}
    if (r.protocol == "inductive" and not heads_given) or r.select:
        needed.add(r.fit_split)
    return sorted(needed)


def read_tables(cfg: Config, run: RunDir, heads_given: bool = False) -> dict[str, Any]:
    r = cfg.rerank
    tables = {}
    for split in needed_splits(cfg, heads_given):
        if not run.has_features(cfg.benchmark, split):
            raise FileNotFoundError(
                f"{run.features_dir(cfg.benchmark, split)} has no features: protocol '{r.protocol}' needs the "
                f"'{split}' split; add it to `splits` (e.g. --set 'splits=[\"val\",\"test\"]') and rerun run-job"
            )
        tables[split] = run.read_features(cfg.benchmark, split, image_ids=run.current_ids(cfg.benchmark, split))
    return tables


def fit_protocol(cfg: Config, tables: dict[str, Any], heads: Heads | None = None):
    """Run the protocol where ``rerank.device`` says (see the module docstring); with ``heads``,
    apply them instead of fitting."""
    if heads is not None:
        return run_protocol(cfg, tables, heads=heads, device="cpu")
    in_ray = on_ray(cfg) and ray.is_initialized()  # executor=local: this process's own GPU, if any
    device = fit_device(cfg.rerank.device, has_gpus() if in_ray else torch.cuda.is_available())
    if device == "cuda" and in_ray:
        print("fit: in a Ray task holding one GPU")
        task = ray.remote(num_gpus=1, num_cpus=1)(run_protocol)
        return ray.get(task.remote(cfg, tables, device="cuda"))
    return run_protocol(cfg, tables, device=device)


def foreign_heads(cfg: Config, heads_dir: str | Path) -> Heads:
    """Heads fitted in another run, checked against this config (architecture and LM feature)."""
    heads = load_heads(heads_dir, cfg)
    fitted_with = heads.meta.get("lm_feature")
    if fitted_with and fitted_with != cfg.scorer.lm_feature:
        raise ValueError(f"{heads_dir}: the heads were fitted with scorer.lm_feature={fitted_with!r} but this run "
                         f"uses {cfg.scorer.lm_feature!r}; pass --set scorer.lm_feature={fitted_with}")
    heads.meta["applied_from"] = str(heads_dir)
    return heads


def _check_features_unchanged(cfg: Config, run: RunDir) -> None:
    before = feature_identity(load_config(config_file=run.config_path))
    now = feature_identity(cfg)
    changed = sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))
    if changed:
        shown = ", ".join(f"{k} ({before.get(k)!r} -> {now.get(k)!r})" for k in changed[:3])
        raise ValueError(f"adjcap fit only refits and picks; {shown} would change the features of {run.path}: "
                         "rerun run-job with that setting (or drop it from --set)")


def main(cfg: Config, run: RunDir, heads_dir: str | Path | None = None) -> dict[str, str]:
    """``heads_dir``: apply heads fitted in another run (its ``heads/``) instead of fitting."""
    r = cfg.rerank
    given = foreign_heads(cfg, heads_dir) if heads_dir is not None else None
    tables = read_tables(cfg, run, heads_given=given is not None)
    result = fit_protocol(cfg, tables, given)
    if result.heads is not None:
        meta = result.summary() | ({"applied_from": str(heads_dir)} if heads_dir is not None else {})
        save_heads(run.heads_dir, result.heads, meta=meta)

    apply = load_features(tables[r.apply_split], lm_feature=cfg.scorer.lm_feature,
                          memory_tokens=r.memattend.memory_tokens)
    status = applicability(apply, result.heads)  # picker -> None (applicable) or why not
    pickers = [name for name, why in status.items() if why is None]
    not_applicable = {name: why for name, why in status.items() if why is not None}
    run.write_fit_summary(r.protocol, {**result.summary(), "not_applicable": not_applicable})
    if r.picker not in pickers:
        pickers.append(r.picker)
    coco_ids = run.coco_ids(cfg.benchmark, r.apply_split)

    def entries(name: str, heads: Heads | None) -> list[dict[str, Any]]:
        if name == r.picker and heads is result.heads:
            chosen = {iid: (p.index, p.caption) for iid, p in result.picks[r.apply_split].items()}
        else:
            idx = pick(apply, name, heads, alpha=result.alpha, beta=result.beta)
            chosen = {iid: (int(i), apply.texts[k][int(i)]) for k, (iid, i) in enumerate(zip(apply.image_ids, idx))}
        out = []
        for iid, (i, caption) in chosen.items():
            e = {"image_id": iid, "caption": caption, "candidate_index": i}
            if iid in coco_ids:
                e["coco_id"] = coco_ids[iid]
            out.append(e)
        return out

    written = {name: str(run.write_predictions(r.protocol, name, entries(name, result.heads))) for name in pickers}
    run.clear_seed_study(r.protocol)
    learned = [name for name in pickers if get_picker(name).learned]
    for seed, heads in result.seed_heads.items():  # rerank.seeds: each learned picker once per seed
        save_heads(run.seed_heads_dir(seed), heads, meta={"seed": seed})
        for name in learned:
            run.write_seed_predictions(r.protocol, name, seed, entries(name, heads))
    if r.seeds is not None and not result.seed_heads:
        print(f"fit: rerank.seeds = {r.seeds} ignored: " + ("the heads were given (--heads), not fitted here"
                                                             if given is not None else "nothing is fitted"))
    print(f"fit: protocol {r.protocol}, picker {r.picker}"
          + (f", heads from {heads_dir}" if heads_dir is not None else "")
          + (f", heads fit on {result.n_fit_images} images of '{result.fit_split}'" if result.heads is not None else "")
          + (f", seeds {', '.join(map(str, result.seed_heads))}" if result.seed_heads else "")
          + f"; predictions for {len(written)} pickers in {run.predictions_dir(r.protocol)}"
          + (f"; not applicable: {', '.join(f'{n} ({w})' for n, w in not_applicable.items())}" if not_applicable else ""))
    return written


def refit(cfg: Config, run: RunDir, heads_dir: str | Path | None = None, log: Sequence[str] = (),
          saved: Config | None = None) -> dict[str, str]:
    """``adjcap fit``: fit and predict, then rewrite the per-sample table (the new picks; their metrics
    stay null until ``adjcap evaluate``) and log the run where asked (``--log``). With ``saved`` (the
    config as given, placeholders kept) the run's config.toml becomes it once heads/ and the predictions
    are written, so config.toml always names the protocol, picker and head settings of heads/; a
    setting that would change the features (they are not recomputed here) is refused first."""
    trackers = parse_log_specs(log)
    with run.lock():
        if saved is not None:
            _check_features_unchanged(saved, run)
        written = main(cfg, run, heads_dir=heads_dir)
        if saved is not None:
            run.write_config(saved.to_toml())
        note_step(run, "fit")
        write_samples(cfg, run)
    if trackers:
        log_run(trackers, run)
    return written

"""``adjcap prepare --for PRESET|TABLE|CHECKPOINT``: the configs a preset or a ``reproduce`` table runs
(a known vision-language checkpoint, :data:`adjcap.models.budget.VLM_PARAMS`: the ``lvlm-chair`` table
with it as the captioner), and the
prepare steps their needs (:mod:`adjcap.machine.needs`) call for. ``all`` prepares for every table's rows
and the chosen preset, so the RN50x64 encoder of the IFCap rows and the Flickr30k-fine-tuned BLIP of
the verifier-substrate row are fetched too."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from adjcap.config import ConfigError, list_presets, load_config
from adjcap.models.budget import VLM_PARAMS
from adjcap.machine.needs import needs_of, steps_for
from adjcap.prepare.errors import PrepareError
from adjcap.registry import unknown

VLM_TABLE = "lvlm-chair"  # the table a vision-language checkpoint given to --for is prepared for


def _data_set(data: Path) -> str:
    return f"paths.data_dir={data}"


def configs_for(target: str, data: Path, sets: Iterable[str] = ()) -> list[Any]:
    """The resolved configs of a preset, or of every run of a reproduce table (rows read at other
    pickers of one run count once), with the data root ``data`` and ``sets`` applied."""
    from adjcap.reproduce import distinct_runs, load_tables, plan_table

    sets = [_data_set(data), *sets]
    try:
        if target in list_presets():
            return [load_config(target, sets).resolved()]
        tables = load_tables()
        if target in tables:
            return [p.resolved for p in distinct_runs(plan_table(tables[target], None, sets))]
        if target in VLM_PARAMS:  # a vision-language checkpoint: what `reproduce lvlm-chair --captioner` runs
            return [p.resolved for p in distinct_runs(plan_table(tables[VLM_TABLE], None,
                                                                 [*sets, f"captioner.vlm.model={target}"]))]
    except ConfigError as e:
        raise PrepareError(f"--for {target}: {e}") from None
    known = [*list_presets(), *load_tables(), *VLM_PARAMS]
    raise PrepareError(f"--for {target}: " + unknown("preset, reproduce table or vision-language checkpoint", target, known,
                                                    see="adjcap config --list, adjcap reproduce --list"))


def configs_for_all(data: Path, preset: str, sets: Iterable[str] = ()) -> list[Any]:
    """``prepare all``: ``preset`` and every reproduce table's runs."""
    from adjcap.reproduce import load_tables

    sets = list(sets)
    out = configs_for(preset, data, sets)
    for key in load_tables():
        out += configs_for(key, data, sets)
    return out


def steps_of_configs(configs: list[Any], order: Iterable[str]) -> list[str]:
    """The prepare steps the configs' needs call for (present or not: a step skips what is there),
    in run ``order``."""
    wanted: set[str] = set()
    for cfg in configs:
        wanted.update(steps_for(needs_of(cfg)))
    if configs:
        wanted.add("models")  # even when every weight is a local path: the step checks them
    return [s for s in order if s in wanted]

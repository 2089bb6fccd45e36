"""A configuration's settings validated: pydantic's errors as one line per key (with "did you mean"),
and the conflicts between settings that the configuration alone shows."""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError

from adjcap.config.keys import close_keys
from adjcap.config.schema import Config, ConfigError
from adjcap.picker_needs import PICKER_NEEDS, picker_names
from adjcap.registry import did_you_mean, suggestion
from adjcap.engine.verifier_families import refusal as verifier_refusal


def validate_config(data: dict[str, Any]) -> Config:
    """:func:`config_data`'s settings -> validated Config (ConfigError naming the field)."""
    try:
        cfg = Config.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_explain(e)) from None
    for check in CONFLICTS:
        problem = check(cfg)
        if problem:
            raise ConfigError(problem)
    return cfg


def _picker_vs_protocol(cfg: Config) -> str | None:
    r = cfg.rerank
    if r.protocol == "training-free" and PICKER_NEEDS.get(r.picker).learned:
        return (f"rerank.picker={r.picker} needs fitted heads but rerank.protocol=training-free fits nothing; "
                f"also set rerank.picker to one of {', '.join(picker_names(learned=False))}, "
                "or use rerank.protocol=inductive/transductive")
    return None


def _verifier_family(cfg: Config) -> str | None:
    return verifier_refusal(cfg.verifier)  # the family's record says what it cannot run


# conflicts the configuration alone shows, refused when it loads (before Ray or any feature pass):
# each returns one line naming the settings and what to do, or None
CONFLICTS = (_picker_vs_protocol, _verifier_family)


def _explain(e: ValidationError) -> str:
    lines = []
    for err in e.errors():
        key = ".".join(str(x) for x in err["loc"])
        if err["type"] == "extra_forbidden":
            lines.append(f"unknown config key '{key}'{suggestion(close_keys(key))}")
        elif err["type"] == "literal_error":
            allowed = re.findall(r"'([^']*)'", str(err.get("ctx", {}).get("expected", "")))
            lines.append(f"bad value for '{key}': {err['msg']} (got {err.get('input')!r})"
                         f"{did_you_mean(err.get('input'), allowed)}")
        else:
            lines.append(f"bad value for '{key}': {err['msg']} (got {err.get('input')!r})")
    if len(lines) == 1:
        return f"invalid configuration: {lines[0]}"
    return "invalid configuration:\n  " + "\n  ".join(lines)

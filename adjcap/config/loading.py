"""A configuration loaded: a preset or a saved config.toml, laid over the defaults, with ``key=value``
overrides and typed updates applied by dotted key (an unknown key is an error naming it), then
validated."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from adjcap.config.keys import close_keys
from adjcap.config.presets import load_preset_dict, over_base, read_settings
from adjcap.config.schema import ROOT_PRECISION_SECTIONS, Config, ConfigError, dict_entry_model, section_model
from adjcap.config.validation import validate_config
from adjcap.nested import deep_update
from adjcap.registry import suggestion


def parse_value(text: str) -> Any:
    """Parse an override's value as a TOML value (numbers, booleans, lists, quoted strings);
    anything that is not valid TOML is taken as a bare string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_override(data: dict[str, Any], assignment: str) -> None:
    """Apply one ``key.path=value`` override (the value parsed as TOML, else a bare string)."""
    if "=" not in assignment:
        raise ConfigError(f"override '{assignment}' must look like key.path=value")
    key, raw = assignment.split("=", 1)
    value = parse_value(raw)
    set_key(data, key.strip(), None if value in ("none", "null") else value)


def set_key(data: dict[str, Any], key: str, value: Any) -> None:
    """Set a dotted key to an already typed value; an unknown key is an error naming it."""
    parts = key.split(".")
    cur: Any = data
    model: Any = Config
    for i, part in enumerate(parts):
        # walk the schema to reject unknown keys with the full dotted name
        if model is not None and isinstance(model, type) and issubclass(model, BaseModel):
            fields = model.model_fields
            if part not in fields:
                typed = ".".join(parts[: i + 1])
                raise ConfigError(
                    f"unknown config key '{typed}'{suggestion(close_keys(key))}; "
                    f"valid keys here: {', '.join(sorted(fields))}"
                )
            model = section_model(fields[part].annotation)
        elif model == "dict":
            model = dict_entry_model(parts[i - 1]) if i > 0 else None
        if i == len(parts) - 1:
            cur[part] = value
        else:
            nxt = cur.get(part)
            if not isinstance(nxt, dict):
                nxt = {}
                cur[part] = nxt
            cur = nxt


def load_config(
    preset: str | None = "headline",
    overrides: list[str] | tuple[str, ...] = (),
    config_file: str | Path | None = None,
    updates: dict[str, Any] | None = None,
) -> Config:
    """Preset (or a saved config.toml) + ``key=value`` overrides + typed ``updates`` ({dotted key:
    value}, e.g. from command-line options; applied last) -> validated Config."""
    return validate_config(config_data(preset, overrides, config_file, updates))


def config_data(
    preset: str | None = "headline",
    overrides: list[str] | tuple[str, ...] = (),
    config_file: str | Path | None = None,
    updates: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """:func:`load_config`'s merged settings before validation (validating imports the registries,
    and with them torch: the command line reads ``numerics`` here first, adjcap.machine.numerics.enter)."""
    if config_file is not None:
        p = Path(config_file)
        if not p.exists():
            raise ConfigError(f"config file {p} does not exist")
        data = over_base(read_settings(p))
    else:
        data = load_preset_dict(preset or "headline")
    full = Config().model_dump(mode="json")
    deep_update(full, data)
    data = full
    for ov in overrides:
        apply_override(data, ov)
    for key, value in (updates or {}).items():
        set_key(data, key, value)
    _refuse_overridden_precision(data, [ov.split("=", 1)[0].strip() for ov in overrides if "=" in ov]
                                 + list(updates or {}))
    return data


def _refuse_overridden_precision(data: dict[str, Any], keys: list[str]) -> None:
    """A model's ``precision`` set here that the root ``precision`` would override (Config.resolved) is refused
    in one line instead of having no effect."""
    root = data.get("precision")
    if root is None:
        return
    for key in keys:
        section = key.rsplit(".", 1)[0] if key.endswith(".precision") else None
        if section not in ROOT_PRECISION_SECTIONS:
            continue
        value = data
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is not None and str(value) != str(root):
            raise ConfigError(f"{key}={value} would have no effect: the root precision={root} sets the precision "
                              f"of {', '.join(ROOT_PRECISION_SECTIONS)}; to give {section} its own, set "
                              f"precision=none and each of them its precision")

"""The presets: TOML files in adjcap/presets, each a named set of settings that may extend a ``base``
preset."""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

from adjcap.config.schema import ConfigError
from adjcap.nested import deep_update
from adjcap.registry import unknown


def presets_dir() -> Path:
    """adjcap/presets: one TOML file per preset."""
    return Path(str(resources.files("adjcap") / "presets"))


def list_presets() -> dict[str, str]:
    """Preset name -> one-line description."""
    out: dict[str, str] = {}
    for p in sorted(presets_dir().glob("*.toml")):
        data = tomllib.loads(p.read_text())
        out[p.stem] = str(data.get("description", ""))
    return out


def load_preset_dict(name: str, _seen: tuple[str, ...] = ()) -> dict[str, Any]:
    """A preset's settings (or a config.toml's, given its path) laid over the ``base`` it extends."""
    path = presets_dir() / f"{name}.toml"
    if not path.exists():
        if Path(name).suffix == ".toml" and Path(name).exists():
            path = Path(name)
        else:
            raise ConfigError(
                f"{unknown('preset', name, list_presets(), see='adjcap config --list')}; "
                "or pass a path to a config.toml"
            )
    if name in _seen:
        raise ConfigError(f"preset '{name}' extends itself through {' -> '.join(_seen)}")
    data = read_settings(path)
    own_name = data.get("name")
    data = over_base(data, _seen + (name,))
    data["name"] = own_name or path.stem
    return data


def read_settings(path: Path) -> dict[str, Any]:
    """A preset's or a config.toml's settings as written (a file that is not TOML is an error naming it)."""
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from e


def over_base(data: dict[str, Any], _seen: tuple[str, ...] = ()) -> dict[str, Any]:
    """Settings laid over the preset their ``base`` key names (the key removed), or as they are without one."""
    base = data.pop("base", None)
    if not base:
        return data
    merged = load_preset_dict(base, _seen)
    deep_update(merged, data)
    return merged

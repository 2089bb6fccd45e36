"""Every dotted configuration key, and the keys a mistyped one most likely meant ("did you mean")."""

from __future__ import annotations

from typing import Any

from adjcap.config.schema import DICT_SECTIONS, Config, dict_entry_model, section_model
from adjcap.registry import close_matches, similar


def config_keys(typed: str = "") -> list[str]:
    """Every dotted config key (sections too), for "did you mean". Keys under a dict of sections
    (``benchmarks.<name>.format``, ``ray.pool.<pool>.actors``) use the name ``typed`` gives, else the
    placeholder of :data:`DICT_SECTIONS`."""
    parts = typed.split(".")
    out: list[str] = []

    def walk(model: Any, prefix: str, depth: int) -> None:
        for name, field in model.model_fields.items():
            key = f"{prefix}{name}"
            out.append(key)
            sub = section_model(field.annotation)
            if sub == "dict":
                value = dict_entry_model(name)
                if value is not None:
                    item = parts[depth + 1] if len(parts) > depth + 2 else DICT_SECTIONS[name][1]
                    walk(value, f"{key}.{item}.", depth + 2)
            elif sub is not None:
                walk(sub, f"{key}.", depth + 1)

    walk(Config, "", 0)
    return out


def close_keys(typed: str, n: int = 3) -> list[str]:
    """The config keys a mistyped dotted key most likely meant: near names in the same section, then
    keys elsewhere whose last part is (nearly) the typed one (``checkpoint`` -> ``captioner.checkpoint``);
    failing both, near keys by their whole dotted name."""
    keys = config_keys(typed)
    section, _, leaf = typed.rpartition(".")
    prefix = f"{section}." if section else ""
    siblings = [k[len(prefix):] for k in keys if k.startswith(prefix) and "." not in k[len(prefix):]]
    out = [prefix + k for k in close_matches(leaf, siblings, n)]
    out += [k for k in keys if similar(leaf, k.rpartition(".")[2])]
    out = [k for k in dict.fromkeys(out) if k != typed]
    return out[:n] or close_matches(typed, keys, n)

"""The one typed run configuration, its presets, overrides and TOML round trip.

A run is fully described by one :class:`Config`. It is built from a preset (a TOML file in
``adjcap/presets``; a preset may name a ``base`` preset it extends) plus ``key=value`` overrides,
validated (unknown keys and bad values are errors that name the key), and written to the run
directory as ``config.toml`` so that ``adjcap run-job --config runs/x/config.toml`` re-runs it as is.

Strings that are paths may use the placeholders ``{cache}`` (``paths.cache_dir``) and ``{data}``
(``paths.data_dir``); :meth:`Config.resolved` expands them once, at the edge.
"""

# The package keeps one job per module: the schema (adjcap.config.schema), the keys and "did you
# mean" (adjcap.config.keys), the presets (adjcap.config.presets), loading with
# overrides (adjcap.config.loading) and validation (adjcap.config.validation); import
# the names from ``adjcap.config``.

from adjcap.config.keys import close_keys, config_keys
from adjcap.config.loading import apply_override, config_data, load_config, parse_value, set_key
from adjcap.config.presets import list_presets, load_preset_dict, presets_dir
from adjcap.config.schema import (
    DICT_SECTIONS,
    BenchmarkCfg,
    CacheCfg,
    CandidatesCfg,
    CaptionerCfg,
    Config,
    ConfigError,
    EncoderCfg,
    EntityCfg,
    EvalCfg,
    HfCaptionerCfg,
    MemAttendCfg,
    PathsCfg,
    PoolCfg,
    Precision,
    RayCfg,
    RerankCfg,
    RetrievalCfg,
    ScorerCfg,
    TriFuseCfg,
    VerifierCfg,
    VlmCaptionerCfg,
    default_benchmarks,
    dict_entry_model,
    section_model,
)
from adjcap.config.validation import CONFLICTS, validate_config

__all__ = [
    "CONFLICTS", "DICT_SECTIONS", "BenchmarkCfg", "CacheCfg", "CandidatesCfg", "CaptionerCfg", "Config", "ConfigError",
    "EncoderCfg", "EntityCfg", "EvalCfg", "HfCaptionerCfg", "MemAttendCfg", "PathsCfg", "PoolCfg", "Precision",
    "RayCfg", "RerankCfg", "RetrievalCfg", "ScorerCfg", "TriFuseCfg", "VerifierCfg", "VlmCaptionerCfg",
    "apply_override", "close_keys", "config_data", "config_keys", "default_benchmarks", "dict_entry_model",
    "list_presets", "load_config", "load_preset_dict", "parse_value", "presets_dir", "section_model", "set_key",
    "validate_config",
]

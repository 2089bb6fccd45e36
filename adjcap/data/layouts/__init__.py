"""Annotation layouts: a registry (registry.py) and one module per layout, each registering one sniff
and one parse function. Importing this package registers them all."""

from adjcap.data.layouts import coco, folder, ifcap, karpathy, lavis, nocaps  # noqa: F401  (registers)
from adjcap.data.layouts.registry import (
    AUTO,
    LAYOUTS,
    Entry,
    Layout,
    check_format,
    dir_layout,
    format_names,
    get_layout,
    register_layout,
    sniff_json,
)

__all__ = [
    "AUTO",
    "LAYOUTS",
    "Entry",
    "Layout",
    "check_format",
    "dir_layout",
    "format_names",
    "get_layout",
    "register_layout",
    "sniff_json",
]

"""The pickers by name and what each needs, as data: the raw scorer columns that must hold values and
the fitted heads. The configuration checks ``rerank.picker`` against it without importing PyTorch;
:mod:`adjcap.rerank.pickers` gives each declared picker its scoring function (and declares the ones
it registers later)."""

from __future__ import annotations

from dataclasses import dataclass

from adjcap.registry import Registry

# the raw scorer columns a picker can read, by name: (column in BeamFeatures.raw_scores, what it is)
SCORERS = {"lm": (0, "LM"), "retrieval": (1, "retrieval cosine"), "verifier": (2, "verifier")}


@dataclass(frozen=True)
class PickerNeeds:
    name: str
    scorers: tuple[str, ...] = ()  # raw scorer columns that must hold finite values
    heads: tuple[str, ...] = ()  # fitted heads it needs

    @property
    def learned(self) -> bool:
        return bool(self.heads)


PICKER_NEEDS: Registry[PickerNeeds] = Registry("picker")


def declare_picker(name: str, scorers: tuple[str, ...] = (), heads: tuple[str, ...] = ()) -> PickerNeeds:
    """Declare picker ``name`` (ValueError on a name already declared or an unknown scorer)."""
    for s in scorers:
        if s not in SCORERS:
            raise ValueError(f"picker {name!r}: unknown scorer {s!r} (known: {', '.join(SCORERS)})")
    needs = PickerNeeds(name, tuple(scorers), tuple(heads))
    PICKER_NEEDS.add(name, needs)
    return needs


def picker_names(learned: bool | None = None) -> list[str]:
    """Declared picker names (all, or only the learned / training-free ones), in declaration order."""
    return [n for n, s in PICKER_NEEDS.items() if learned is None or s.learned == learned]


declare_picker("lm", scorers=("lm",))
declare_picker("retrieval", scorers=("retrieval",))
declare_picker("verifier", scorers=("verifier",))
declare_picker("fixed", scorers=("lm", "retrieval"))
declare_picker("trifuse", heads=("trifuse",))
declare_picker("memattend", heads=("memattend",))
declare_picker("ensemble", heads=("trifuse", "memattend"))

"""Names a user types, and the one "did you mean" for all of them.

Every lookup of a user-typed name (a preset, a reproduce table, a benchmark, a picker, a head, a
protocol, a ``--set`` key, a format, a prepare step, a tracker) goes through :func:`lookup` or
:func:`unknown`, so an unknown name is always one line naming the close matches and the known ones::

    lookup(tables, "ablaton", "table", error=ConfigError, see="adjcap reproduce --list")
    # ConfigError: unknown table 'ablaton'; did you mean 'ablation'? (known: reproduction, ..., clipscore)

Objects that register themselves by name (pickers, heads) live in a :class:`Registry`::

    PICKERS = Registry("picker")

    @PICKERS.register("lm")
    def ...

    PICKERS.get("ensembel")  # ValueError: unknown picker 'ensembel'; did you mean 'ensemble'? (known: ...)
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Generic, TypeVar

T = TypeVar("T")
V = TypeVar("V")

def close_matches(name: object, known: Iterable[str], n: int = 3) -> list[str]:
    """The known names closest to ``name``, best first: difflib's (ratio >= 0.6), then the names of
    the same family (one is a prefix of the other, or they share the first ``-`` word: ``ifcap`` and
    ``ifcap-nocaps`` for ``ifcap-coco``); case does not count."""
    known = list(dict.fromkeys(str(k) for k in known))
    lower = {k.lower(): k for k in reversed(known)}  # case does not count (cider -> CIDEr)
    text = str(name).lower()
    close = [lower[k] for k in difflib.get_close_matches(text, list(lower), n=n, cutoff=0.6)]
    if len(text) >= 3:
        head = text.split("-")[0] if "-" in text else None
        family = [k for k in known if k.lower().startswith(text) or text.startswith(k.lower())
                  or (head and k.lower().split("-")[0] == head)]
        close += [k for k in family if k not in close]
    return close[:n]


def similar(a: str, b: str, cutoff: float = 0.8) -> bool:
    """Whether two names are near (difflib's ratio >= ``cutoff``): a stricter test than :func:`close_matches`."""
    return difflib.SequenceMatcher(None, a, b).ratio() >= cutoff


def suggestion(close: Iterable[str]) -> str:
    """``"; did you mean 'a'?"`` / ``"; did you mean 'a' or 'b'?"``, or ``""`` for no names."""
    close = [repr(str(c)) for c in close]
    if not close:
        return ""
    return "; did you mean " + (close[0] if len(close) == 1 else ", ".join(close[:-1]) + " or " + close[-1]) + "?"


def did_you_mean(name: object, known: Iterable[str], n: int = 3) -> str:
    """:func:`suggestion` of the :func:`close_matches` of ``name``."""
    return suggestion(close_matches(name, known, n))


def unknown(kind: str, name: object, known: Iterable[str], see: str | None = None) -> str:
    """The one-line error for an unknown name: the close matches first, then every known name (and
    ``see``, the command that lists them with descriptions)."""
    known = list(dict.fromkeys(str(k) for k in known))
    listed = "known: " + (", ".join(known) or "none") + (f"; {see}" if see else "")
    return f"unknown {kind} {str(name)!r}{did_you_mean(name, known)} ({listed})"


def lookup(mapping: Mapping[str, V], name: str, kind: str, error: type[Exception] = ValueError,
           see: str | None = None) -> V:
    """``mapping[name]``, else ``error`` with :func:`unknown`'s one line."""
    try:
        return mapping[name]
    except (KeyError, TypeError):
        raise error(unknown(kind, name, mapping, see)) from None


def check(name: str, known: Iterable[str], kind: str, error: type[Exception] = ValueError,
          see: str | None = None) -> str:
    """``name`` when it is one of ``known``, else ``error`` with :func:`unknown`'s one line."""
    known = list(known)
    if name not in known:
        raise error(unknown(kind, name, known, see))
    return name


class Registry(Generic[T]):
    """Registered objects by name, in registration order."""

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

    def add(self, name: str, obj: T) -> T:
        if name in self._items:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._items[name] = obj
        return obj

    def register(self, name: str, wrap: Callable[[str, Callable], T] | None = None) -> Callable[[Callable], Callable]:
        """Decorator: register the decorated object (or ``wrap(name, obj)``) under ``name``."""

        def deco(obj: Callable) -> Callable:
            self.add(name, wrap(name, obj) if wrap is not None else obj)  # type: ignore[arg-type]
            return obj

        return deco

    def unknown(self, name: object) -> str:
        """The one-line error for an unknown name: the close matches and every known name."""
        return unknown(self.kind, name, self._items)

    def get(self, name: str) -> T:
        return lookup(self._items, name, self.kind)

    def names(self) -> list[str]:
        return list(self._items)

    def items(self) -> list[tuple[str, T]]:
        return list(self._items.items())

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

"""A small name -> object registry (the reranker's pickers and heads register into one each).

    PICKERS = Registry("picker")

    @PICKERS.register("lm")
    def ...

    PICKERS.get("ensembel")  # ValueError: unknown picker 'ensembel'; did you mean 'ensemble'? (known: ...)
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


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
        known = ", ".join(self._items)
        close = difflib.get_close_matches(str(name), list(self._items), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"unknown {self.kind} {name!r}{hint} (known: {known})"

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except (KeyError, TypeError):
            raise ValueError(self.unknown(name)) from None

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

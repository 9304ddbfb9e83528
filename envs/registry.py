"""A small registry of named descriptors (verl-free, no imports of the project): one per kind of thing that code
looks up by name instead of comparing names (the environment families here, the jobs' families in
``stare_verl.jobs.families``).

An entry is registered under its ``name`` and answers to its ``aliases`` too (older spellings that data, recipes or
run folders still carry); a lookup by alias returns the entry, whose ``name`` is the one spelling code writes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Generic[T]):
    """Entries with a ``name`` (str) and optional ``aliases`` (strs), looked up by either.

    Args:
        kind: what an entry is, for error messages (``"environment family"``).
        builtins: returns the built-in entries; called once, on the first use (so that the modules defining them
            are imported only when the registry is asked).
    """

    def __init__(self, kind: str, builtins: Callable[[], Iterable[T]] | None = None) -> None:
        self.kind = kind
        self._builtins = builtins
        self._entries: dict[str, T] = {}
        self._aliases: dict[str, str] = {}  # alias -> name

    def _load(self) -> None:
        if self._builtins is not None:
            load, self._builtins = self._builtins, None
            for entry in load():
                if getattr(entry, "name", None) not in self._entries:
                    self.register(entry)

    @staticmethod
    def _names(entry: Any) -> tuple[str, tuple[str, ...]]:
        name = getattr(entry, "name", None)
        if not isinstance(name, str) or not name:
            raise ValueError(f"a registry entry needs a non-empty str name, got {name!r}")
        return name, tuple(getattr(entry, "aliases", ()) or ())

    def register(self, entry: T, *, replace: bool = False) -> T:
        """Register ``entry`` under its name and aliases; returns it.

        Raises:
            ValueError: the name is taken by another entry (unless ``replace``), or one of its spellings (name or
                alias) is already another entry's.
        """
        self._load()
        name, aliases = self._names(entry)
        old = self._entries.get(name)
        if old is not None and old != entry and not replace:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        for spelling in (name, *aliases):
            owner = self._aliases.get(spelling, spelling if spelling in self._entries else None)
            if owner is not None and owner != name:
                raise ValueError(f"{self.kind} {spelling!r} already names {owner!r}")
        if old is not None:
            self.unregister(name)
        self._entries[name] = entry
        self._aliases.update((a, name) for a in aliases if a != name)
        return entry

    def unregister(self, name: str) -> None:
        """Remove the entry of ``name`` (or alias) if there is one, with its aliases (a built-in comes back only in a
        new process)."""
        self._load()
        name = self._aliases.get(name, name)
        if self._entries.pop(name, None) is not None:
            self._aliases = {a: n for a, n in self._aliases.items() if n != name}

    def find(self, name: Any) -> T | None:
        """The entry of ``name`` (its name or an alias), None for anything else (a non-str too)."""
        self._load()
        if not isinstance(name, str):
            return None
        return self._entries.get(self._aliases.get(name, name))

    def get(self, name: Any) -> T:
        """The entry of ``name`` (its name or an alias). Raises ValueError, naming the registered ones, otherwise."""
        entry = self.find(name)
        if entry is None:
            raise ValueError(f"unknown {self.kind} {name!r}; expected one of {list(self.names())}")
        return entry

    def names(self) -> tuple[str, ...]:
        """The registered names in registration order (built-ins first; no aliases)."""
        self._load()
        return tuple(self._entries)

    def spellings(self) -> tuple[str, ...]:
        """Every name and alias that :meth:`get` accepts (names first), e.g. for a CLI's ``choices``."""
        self._load()
        return (*self._entries, *self._aliases)

    def values(self) -> tuple[T, ...]:
        """The registered entries in registration order."""
        self._load()
        return tuple(self._entries.values())

    def __iter__(self) -> Iterator[T]:
        return iter(self.values())

    def __contains__(self, name: object) -> bool:
        return self.find(name) is not None

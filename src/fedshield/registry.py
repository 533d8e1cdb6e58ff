"""Name → factory registries shared by configs and ``fedshield list``.

One :class:`Registry` per kind (datasets, models, aggregators, ...). Entries are filled by
the ``@REG.register("name")`` decorator when the defining module is imported, as timm does,
so the config vocabulary and the CLI listing can never drift apart.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class RegistryError(KeyError):
    """An unknown name was requested; the message lists the known names."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class Registry(Generic[T]):
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._help: dict[str, str] = {}

    def register(self, name: str, help: str | None = None) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self._entries[name] = obj
            doc = help or inspect.getdoc(obj) or ""
            self._help[name] = doc.strip().splitlines()[0] if doc.strip() else ""
            return obj

        return deco

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            close = difflib.get_close_matches(name, self._entries, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise RegistryError(
                f"unknown {self.kind} {name!r}{hint}; known: {', '.join(sorted(self._entries))}"
            ) from None

    def build(self, name: str, /, **kwargs: Any) -> Any:
        """Call the registered factory, dropping ``None`` kwargs (timm's convention)."""
        factory = self.get(name)
        return factory(**{k: v for k, v in kwargs.items() if v is not None})  # type: ignore[operator]

    def names(self) -> list[str]:
        return sorted(self._entries)

    def help(self, name: str) -> str:
        return self._help.get(name, "")

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

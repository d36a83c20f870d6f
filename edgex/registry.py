"""Name -> implementation registries, filled by decorators in the modules of a package.

Adding a recipe, exporter or runtime is one new module that registers itself; `discover` imports
every module of the package so nothing has to list them by hand.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Generic, Iterator, TypeVar

from .errors import EdgexError

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str, package: str):
        self.kind = kind
        self.package = package
        self._items: dict[str, T] = {}
        self._discovered = False

    def register(self, name: str):
        def add(obj: T) -> T:
            if name in self._items:
                raise RuntimeError(f"{self.kind} {name!r} registered twice")
            self._items[name] = obj() if isinstance(obj, type) else obj  # classes register one instance
            return obj

        return add

    def _discover(self) -> None:
        if self._discovered:
            return
        self._discovered = True
        pkg = importlib.import_module(self.package)
        for info in pkgutil.iter_modules(pkg.__path__):
            if not info.name.startswith("_") and info.name != "base":
                importlib.import_module(f"{self.package}.{info.name}")

    def get(self, name: str) -> T:
        self._discover()
        try:
            return self._items[name]
        except KeyError:
            raise EdgexError(f"no such {self.kind} {name!r} (known: {', '.join(self.names())})") from None

    def names(self) -> list[str]:
        self._discover()
        return sorted(self._items)

    def items(self) -> Iterator[tuple[str, T]]:
        self._discover()
        return iter(sorted(self._items.items()))

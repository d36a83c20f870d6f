"""Name -> implementation registries, filled by decorators in the modules of a package.

Adding a recipe, exporter or runtime is one new module (or package) that registers itself;
discovery walks the package's folder so nothing has to list them by hand.

Names are checked before any work starts, so the facts that checking needs (names, presets,
components, precisions, options) must be readable without importing torch and the toolchains.
Exporter and runtime modules are light themselves: they import their toolchain inside the methods
that use it. A recipe is heavy (its eager model imports torch and transformers), so a recipe
package splits in two: `facts.py` declares `FACTS` and imports nothing heavy, and `recipe.py`
registers the implementation. `facts(name)` reads the first, `get(name)` imports the second.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from typing import Any, Generic, Iterator, TypeVar

from .errors import EdgexError

T = TypeVar("T")

FACTS_MODULE = "facts"  # light declaration of a split package (`FACTS`, with a `.name`)
IMPLEMENTATION_MODULE = "recipe"  # the heavy module of a split package, which registers itself


class Registry(Generic[T]):
    def __init__(self, kind: str, package: str):
        self.kind = kind
        self.package = package
        self._items: dict[str, T] = {}
        self._facts: dict[str, Any] = {}
        self._implementations: dict[str, str] = {}  # name -> heavy module of a split package
        self._discovered = False

    def register(self, name: str):
        def add(obj: T) -> T:
            if name in self._items:
                raise RuntimeError(f"{self.kind} {name!r} registered twice")
            self._items[name] = obj() if isinstance(obj, type) else obj  # classes register one instance
            return obj

        return add

    def _discover(self) -> None:
        """Import each light module of the package, and each split package's `facts` module."""
        if self._discovered:
            return
        self._discovered = True
        pkg = importlib.import_module(self.package)
        for folder in pkg.__path__:
            for child in sorted(Path(folder).iterdir()):
                if (child / f"{FACTS_MODULE}.py").is_file() and not child.name.startswith("_"):
                    module = f"{self.package}.{child.name}"
                    facts = importlib.import_module(f"{module}.{FACTS_MODULE}").FACTS
                    if facts.name in self._facts:
                        raise RuntimeError(f"{self.kind} {facts.name!r} declared twice")
                    self._facts[facts.name] = facts
                    self._implementations[facts.name] = f"{module}.{IMPLEMENTATION_MODULE}"
        for info in pkgutil.iter_modules(pkg.__path__):
            if not info.ispkg and not info.name.startswith("_") and info.name != "base":
                importlib.import_module(f"{self.package}.{info.name}")

    def _unknown(self, name: str) -> EdgexError:
        return EdgexError(f"no such {self.kind} {name!r} (known: {', '.join(self.names())})")

    def facts(self, name: str):
        """What a name declares, without importing its implementation (for light modules: the
        registered object itself)."""
        self._discover()
        if name in self._facts:
            return self._facts[name]
        if name in self._items:
            return self._items[name]
        raise self._unknown(name)

    def get(self, name: str) -> T:
        self._discover()
        if name not in self._items and name in self._implementations:
            importlib.import_module(self._implementations[name])
        try:
            return self._items[name]
        except KeyError:
            raise self._unknown(name) from None

    def names(self) -> list[str]:
        self._discover()
        return sorted({*self._items, *self._facts})

    def all_facts(self) -> Iterator[tuple[str, Any]]:
        """(name, facts) for every entry, light."""
        return iter((name, self.facts(name)) for name in self.names())

    def items(self) -> Iterator[tuple[str, T]]:
        """(name, implementation) for every entry: imports split packages' implementations."""
        return iter((name, self.get(name)) for name in self.names())

"""Import every module of a package so its ``@REGISTRY.register`` decorators run.

New methods become available by adding a module, with no list to edit (and no merge
conflicts between methods developed side by side).
"""

from __future__ import annotations

import importlib
import pkgutil


def import_submodules(package: str) -> None:
    pkg = importlib.import_module(package)
    for info in pkgutil.iter_modules(pkg.__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{package}.{info.name}")

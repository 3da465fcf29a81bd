"""Package exports imported on first use (PEP 562), for the packages whose modules need torch or transformers.

    # pasta/lang/__init__.py
    __getattr__ = lazy_exports(__name__, {"pasta.lang.layout": ("build_layout", ...)}, globals())

Every command composes its config and checks its settings before its work starts (pasta.cli): the schemas it reads
live in these packages, and a refused command line should cost Python, Hydra and the settings, not a torch import.
`from pasta.lang import build_layout` still works: it imports pasta.lang.layout then.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, modules: dict[str, tuple[str, ...]], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """A module `__getattr__` for `package`: a name of `modules[m]` imports module m and binds all of that module's
    names in `namespace` (the package's globals), so each module is imported once."""
    module_of = {name: module for module, names in modules.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name not in module_of:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(module_of[name])
        for loaded in modules[module_of[name]]:
            namespace[loaded] = getattr(module, loaded)
        return namespace[name]

    return __getattr__

"""Re-exports loaded on first use (PEP 562), one implementation for every package that has them.

A package ``__init__`` lists where each name lives (``homes``: name → module) and, out of mypy's
sight (a module ``__getattr__`` would make every name ``Any``; mypy reads an ``if TYPE_CHECKING:``
import block instead), takes its ``__getattr__`` and ``__dir__`` from :func:`lazy_exports`::

    if not TYPE_CHECKING:
        __getattr__, __dir__ = lazy_exports(__name__, _HOMES, globals())

So ``from agent import NotFound`` loads ``agent.errors``, not the runtime, and the CLI stays light
(``tests/daemon/test_cli_imports.py``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(
    package: str, homes: dict[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``: a name in ``homes`` is imported from its home
    on first use and kept in ``namespace`` (the package's globals); a home that is the submodule of
    that name gives the module itself."""

    def __getattr__(name: str) -> object:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(home)
        value = module if home == f"{package}.{name}" else getattr(module, name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(homes))

    return __getattr__, __dir__

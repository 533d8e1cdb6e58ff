"""What a user's callable accepts (a callback's optional keyword, a reference function's
round number)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any


def accepts(fn: Callable[..., Any] | None, name: str) -> bool:
    """True when ``fn`` has a parameter called ``name``; False for None and for callables
    without a signature (some builtins)."""
    if fn is None:
        return False
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


__all__ = ["accepts"]

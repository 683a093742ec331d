"""httpx without its own command line: the package's `__init__` imports `httpx._main` (its CLI), which
loads rich, pygments and click when they are installed — about 0.1 s of CPU, and more wall time on a busy
machine, that a client never uses. A placeholder module for `httpx._main` keeps it out; `httpx` itself is
the real one. Import httpx from here (`from ctfleet._httpx import httpx`)."""

from __future__ import annotations

import sys
import types
from typing import Any


def _no_cli(*args: Any, **kwargs: Any) -> None:
    raise SystemExit("httpx's command line is not loaded in this process (ctfleet keeps it out); run `httpx` itself.")


if "httpx" not in sys.modules and "httpx._main" not in sys.modules:
    _placeholder = types.ModuleType("httpx._main")
    _placeholder.main = _no_cli  # type: ignore[attr-defined]
    sys.modules["httpx._main"] = _placeholder

import httpx  # noqa: E402

__all__ = ["httpx"]

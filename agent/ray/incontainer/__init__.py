"""The program the docker runtime runs inside a Ray head container, and how its answer is read back.

`program()` is the source of `agent.ray.gcs` (stdlib plus Ray) followed by `helper.py`'s, both read as
package data with `importlib.resources`; ``python -c`` runs it with the container's own Ray.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from agent.errors import CommandFailed

MARKER = "RAYJSON"


def program() -> str:
    """The ``python -c`` program for status and drain inside a Ray container."""
    gcs = resources.files("agent.ray").joinpath("gcs.py").read_text(encoding="utf-8")
    helper = resources.files(__name__).joinpath("helper.py").read_text(encoding="utf-8")
    return f"{gcs}\n\n{helper}"


def result_of(code: int, output: str, what: str) -> dict[str, Any]:
    """The JSON answer in the program's `output`; `CommandFailed` with the output when there is none."""
    for line in reversed(output.splitlines()):
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER) :])
    raise CommandFailed("not_found" if code else "internal", f"{what} failed (exit {code}): {output[-1500:]}")


__all__ = ["MARKER", "program", "result_of"]

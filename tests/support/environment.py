"""Tests that need something a machine may lack — Podman (and podman-compose), the Ray node images, vLLM's
CPU engine, Chromium (and Playwright) — go through `missing` (or the `needs` marker) when it is absent.

On a developer's machine that is a skip saying how to get it. On the CI machine (`CI=true`), which installs
all of them, the same absence is a failure: a broken install must not pass as a run of skipped tests.
A GPU is the exception: CI has none, so GPU tests keep a plain skip (`tests/agent/test_gpu_node.py`).
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

MARKER = "needs_environment"


def on_ci() -> bool:
    """Whether this run is the CI machine's (`CI=true`, as CI services set it)."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def missing(what: str, how: str) -> NoReturn:
    """`what` is not on this machine: skip saying `how` to get it, or fail on CI, which provides it."""
    message = f"{what}: {how}"
    if on_ci():
        pytest.fail(f"{message} (CI=true: the CI machine installs it, so its absence fails the run)", pytrace=False)
    pytest.skip(message)


def needs(present: bool, what: str, how: str) -> pytest.MarkDecorator:
    """A marker for tests that need `what`: checked before each of them (`tests/conftest.py`) as `missing`."""
    return getattr(pytest.mark, MARKER)(present=present, what=what, how=how)


def check_marks(item: pytest.Item) -> None:
    """Skip or fail `item` (see `missing`) for the first `needs` marker whose requirement is absent."""
    for mark in item.iter_markers(MARKER):
        if not mark.kwargs["present"]:
            missing(mark.kwargs["what"], mark.kwargs["how"])

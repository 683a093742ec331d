"""Tests needing what CI installs (Podman, the Ray images, vLLM's CPU engine, Chromium) skip on a developer's
machine without it and fail on CI (`CI=true`), through one helper (`tests.support.environment`); GPU tests
keep their skip (CI has no GPU)."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.support import environment

ROOT = Path(__file__).resolve().parents[2]
# What the CI machine installs: a skip naming one of these must go through the helper.
PROVIDED_BY_CI = ("podman", "rayproject/ray", "ray-image", "vllm", "chromium", "playwright")


def test_missing_skips_on_a_developers_machine(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=re.escape("no Podman socket: run .ci/podman-setup")):
        environment.missing("no Podman socket", "run .ci/podman-setup")


@pytest.mark.parametrize("value", ["true", "1", "TRUE"])
def test_missing_fails_on_ci(monkeypatch, value):
    monkeypatch.setenv("CI", value)
    with pytest.raises(
        pytest.fail.Exception, match=re.escape("vLLM's CPU engine is not built here: bash .ci/vllm-venv")
    ):
        environment.missing("vLLM's CPU engine is not built here", "bash .ci/vllm-venv")


def _item(*marks: pytest.MarkDecorator) -> SimpleNamespace:
    return SimpleNamespace(iter_markers=lambda name: [m.mark for m in marks if m.mark.name == name])


def test_the_needs_marker_checks_before_the_test(monkeypatch):
    monkeypatch.setenv("CI", "true")
    environment.check_marks(_item(environment.needs(True, "Chromium is not installed", "apt-get install chromium")))
    with pytest.raises(pytest.fail.Exception, match="Chromium is not installed"):
        environment.check_marks(
            _item(environment.needs(False, "Chromium is not installed", "apt-get install chromium"))
        )
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception):
        environment.check_marks(
            _item(environment.needs(False, "Chromium is not installed", "apt-get install chromium"))
        )


def _skip_texts(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, text) of every pytest.skip / importorskip / skipif call's string arguments."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = ast.unparse(node.func)
        if name not in ("pytest.skip", "pytest.importorskip", "pytest.mark.skipif"):
            continue
        text = " ".join(
            part.value
            for arg in [*node.args, *(k.value for k in node.keywords)]
            for part in ast.walk(arg)
            if isinstance(part, ast.Constant) and isinstance(part.value, str)
        )
        found.append((node.lineno, text))
    return found


def test_every_skip_for_what_ci_installs_goes_through_the_helper():
    offenders = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if path.name == "environment.py":
            continue
        for line, text in _skip_texts(ast.parse(path.read_text())):
            if any(word in text.lower() for word in PROVIDED_BY_CI):
                offenders.append(f"{path.relative_to(ROOT)}:{line}: {text[:80]}")
    assert offenders == [], f"skips of what CI installs (use tests.support.environment.missing/needs): {offenders}"


def test_the_scan_sees_a_plain_skip():
    assert _skip_texts(ast.parse('pytest.skip("Podman is not installed")')) == [(1, "Podman is not installed")]

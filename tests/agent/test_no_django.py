"""The agent package runs on nodes without Django: importing any of its modules never loads Django."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import agent

AGENT_DIR = Path(agent.__file__).parent


def test_agent_modules_import_without_django():
    modules = [
        m.name for m in pkgutil.walk_packages([str(AGENT_DIR)], prefix="agent.") if not m.name.endswith("__main__")
    ]
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "loaded = sorted(m for m in sys.modules if m == 'django' or m.startswith('django.'))\n"
        "print(loaded)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=AGENT_DIR.parent)
    assert out.stdout.strip() == "[]"


def test_agent_sources_never_mention_django_imports():
    offenders = [
        str(path)
        for path in AGENT_DIR.rglob("*.py")
        if any(line.lstrip().startswith(("import django", "from django")) for line in path.read_text().splitlines())
    ]
    assert offenders == []

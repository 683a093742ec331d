"""The client is a package of its own: it imports nothing of the control plane or Django, and `--help`
loads neither the HTTP stack nor YAML nor rich (what keeps the command's start fast)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import ctfleet

PACKAGE = Path(ctfleet.__file__).parent
FORBIDDEN = {
    "django",
    "rest_framework",
    "fleet",
    "raymgr",
    "tenancy",
    "audit",
    "kernel",
    "cleverthis",
    "agent",
    "tests",
}


def test_no_module_of_the_client_imports_the_control_plane_or_django():
    offenders = {}
    for path in PACKAGE.rglob("*.py"):
        tops = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                tops.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                tops.add(node.module.split(".")[0])
        if tops & FORBIDDEN:
            offenders[path.name] = sorted(tops & FORBIDDEN)
    assert offenders == {}


def test_help_loads_no_http_stack_yaml_or_rich():
    code = (
        "import sys\n"
        "from ctfleet import cli\n"
        "try:\n"
        "    cli.cli(['--help'], prog_name='ctfleet')\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(sorted(m for m in ('httpx', 'yaml', 'rich', 'django', 'ctfleet.models') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd="/")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
    assert "Usage: ctfleet" in done.stdout


def test_every_verb_has_an_example_in_its_help():
    from ctfleet.cli import cli

    missing = []

    def walk(group, prefix):
        for name, command in group.commands.items():
            if hasattr(command, "commands"):
                walk(command, f"{prefix}{name} ")
            elif "Example" not in (command.help or ""):
                missing.append(f"{prefix}{name}")

    walk(cli, "")
    assert missing == []


def test_completion_scripts_for_bash_and_zsh():
    from click.testing import CliRunner
    from ctfleet.cli import cli

    for shell, marker in (("bash", "complete -o nosort -F"), ("zsh", "#compdef ctfleet")):
        result = CliRunner().invoke(cli, ["completion", shell])
        assert result.exit_code == 0, result.output
        assert marker in result.output
        assert "_CTFLEET_COMPLETE" in result.output


def test_bash_completion_completes_verbs_and_resource_names():
    from tests.cli.conftest import CTFLEET

    def complete(words: str, cword: int) -> list[str]:
        env = {"_CTFLEET_COMPLETE": "bash_complete", "COMP_WORDS": words, "COMP_CWORD": str(cword), "PATH": "/usr/bin"}
        done = subprocess.run([CTFLEET], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return [line.split(",", 1)[1] for line in done.stdout.splitlines()]

    assert complete("ctfleet ge", 1) == ["get"]
    assert complete("ctfleet get no", 2) == ["nodes"]
    assert complete("ctfleet describe ray", 2) == ["rayclusters"]

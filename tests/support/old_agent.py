"""A real agent of the previous protocol version, taken from this repository's own history.

`previous_protocol_tree` finds the commit that raised `PROTOCOL_VERSION` to the current value and
extracts its parent's `agent/` package (`git archive`), i.e. the agent exactly as the previous release
shipped it: its own protocol module, its own tunnel client, its own idea of which frames exist. Run with
that directory as working directory (`python -m` puts it first on sys.path), it is that old agent,
on the shared venv's interpreter and dependencies. Nothing in the current code is pinned or faked.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from agent import protocol as p
from tests.support.processes import REPO_ROOT, ManagedProcess, clean_environ


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout


# Where `PROTOCOL_VERSION` is defined: the protocol package's `versions` module, a single module before.
VERSION_FILES = ("agent/protocol/versions.py", "agent/protocol.py")


def _protocol_version_at(commit: str) -> int | None:
    for path in VERSION_FILES:
        try:
            text = _git("show", f"{commit}:{path}")
        except subprocess.CalledProcessError:
            continue
        found = re.search(r"(?m)^PROTOCOL_VERSION = (\d+)$", text)
        return int(found.group(1)) if found else None
    return None


def protocol_commit(version: int) -> str | None:
    """The newest commit whose agent speaks protocol `version` only (the parent of the commit that raised it
    past `version`; HEAD while that raise is not committed yet); None without git history."""
    if shutil.which("git") is None:
        return None
    try:
        raised = _git(
            "log",
            "--reverse",
            "--format=%H",
            "-G",
            rf"^PROTOCOL_VERSION = {version + 1}$",
            "--",
            *VERSION_FILES,
        ).split()
    except subprocess.CalledProcessError:
        return None
    if raised:
        candidates = [f"{raised[0]}^"]
    else:  # not committed yet: HEAD is the previous release
        candidates = ["HEAD"] if version + 1 == p.PROTOCOL_VERSION else []
    for commit in candidates:
        if _protocol_version_at(commit) == version:
            return _git("rev-parse", commit).strip()
    return None


def previous_protocol_commit() -> str | None:
    """The newest commit whose agent speaks `PROTOCOL_VERSION - 1` only; None without git history."""
    return protocol_commit(p.PROTOCOL_VERSION - 1)


def protocol_tree(target: Path, version: int) -> tuple[Path, str] | None:
    """Extract the `agent/` of the newest commit speaking protocol `version` into `target`; (directory,
    commit) or None."""
    commit = protocol_commit(version)
    if commit is None:
        return None
    target.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "archive", commit, "agent"], cwd=REPO_ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    return target, commit


def previous_protocol_tree(target: Path) -> tuple[Path, str] | None:
    """Extract the previous protocol version's `agent/` into `target`; (directory, commit) or None."""
    return protocol_tree(target, p.PROTOCOL_VERSION - 1)


def old_env(tree: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment that makes `python -m agent` the old tree's agent."""
    return {**clean_environ(), "PYTHONPATH": str(tree), **(extra or {})}


def old_agent_join(tree: Path, url: str, token: str, state_dir: Path) -> subprocess.CompletedProcess:
    """`python -m agent join` of the old agent."""
    argv = [sys.executable, "-m", "agent", "join", "--url", url, "--token", token, "--state-dir", str(state_dir)]
    return subprocess.run(argv, cwd=tree, env=old_env(tree), capture_output=True, text=True, timeout=60)


def old_agent_run(tree: Path, state_dir: Path, log_dir: Path, *, name: str, env: dict[str, str]) -> ManagedProcess:
    """`python -m agent run` of the old agent, as a managed process (stopped with its process group)."""
    argv = [sys.executable, "-m", "agent", "run", "--state-dir", str(state_dir)]
    return ManagedProcess(name, argv, log_dir=log_dir, env=old_env(tree, env), cwd=tree)

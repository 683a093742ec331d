"""Which agent version this is: stamped into packages the control plane builds, else derived from the code.

A package built by the control plane carries `agent/_version.py` (`VERSION = "<release>+<digest>"`).
Code run from a checkout or an editable install has no such file: its version is the distribution's
release plus the digest of its own sources, computed the same way, so a control plane and an agent of
the same code agree on the version.
"""

from __future__ import annotations

import functools
import hashlib
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "cleverthis-compute-fleet"
VERSION_FILE = "_version.py"
_SKIPPED_DIRS = {"__pycache__"}


def source_digest(package_dir: Path) -> str:
    """SHA-256 (12 hex characters) over the agent package's files: their paths and contents."""
    digest = hashlib.sha256()
    for path in sorted(package_dir.rglob("*")):
        relative = path.relative_to(package_dir)
        if not path.is_file() or _SKIPPED_DIRS & set(relative.parts) or path.suffix == ".pyc":
            continue
        if relative.as_posix() == VERSION_FILE:
            continue
        digest.update(relative.as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def release() -> str:
    """The distribution's release number (pyproject's `version`), "0" when it is not installed."""
    try:
        return metadata.version(DISTRIBUTION).split("+", 1)[0]
    except metadata.PackageNotFoundError:
        return "0"


def version_of(package_dir: Path, release_number: str) -> str:
    """The version a package built from `package_dir` (the `agent` directory) carries."""
    return f"{release_number}+{source_digest(package_dir)}"


@functools.cache
def agent_version() -> str:
    """This agent's version: the stamped one, else derived from its own sources."""
    try:
        from agent import _version  # type: ignore[attr-defined]

        return str(_version.VERSION)
    except ImportError:
        return version_of(Path(__file__).resolve().parent.parent, release())

"""Agent versions installed beside the running one, the `current` link that picks one, and the update marker.

Layout under `<state dir>/versions/`: one directory per version holding its `agent/` package, a symlink
`current` naming the version to run (absent: run the code the agent was installed with), and
`update.json`, the marker of the update in flight: where it comes from, where it goes, the command it
answers and the deadline by which the new version must have connected.
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath

from agent.update.version import VERSION_FILE

CURRENT = "current"
MARKER = "update.json"
# Versions kept on disk besides the current and the previous one.
KEEP = 2


class InstallError(Exception):
    """The package cannot be installed (not an agent package, wrong version, unsafe paths)."""


@dataclass(frozen=True)
class UpdateMarker:
    """An update in flight (`trial`), confirmed by the new version, or rolled back."""

    state: str  # trial | confirmed | rolled_back
    from_version: str
    from_dir: str  # "" = the installed base code
    to_version: str
    key: str  # the agent.update command's idempotency key
    command_id: str
    started_at: float
    deadline: float
    reason: str = ""


class VersionStore:
    """The versions directory of one node."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    # ---- versions

    def version_dir(self, version: str) -> Path:
        return self.root / version

    def current_dir(self) -> Path | None:
        """The directory `current` points at, or None (run the installed base code)."""
        link = self.root / CURRENT
        if not link.is_symlink():
            return None
        target = (self.root / os.readlink(link)).resolve()
        return target if (target / "agent" / "__main__.py").is_file() else None

    def install(self, package: Path, version: str) -> Path:
        """Unpack the `agent/` package of sdist `package` into `versions/<version>/`; its directory."""
        staging = self.root / f".{version}.partial"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        try:
            with tarfile.open(package, "r:gz") as archive:
                for member in archive.getmembers():
                    parts = PurePosixPath(member.name).parts
                    if len(parts) < 3 or parts[1] != "agent":
                        continue
                    relative = PurePosixPath(*parts[1:])
                    if relative.is_absolute() or ".." in relative.parts:
                        raise InstallError(f"unsafe path in the package: {member.name}")
                    target = staging / relative
                    if member.isdir():
                        target.mkdir(parents=True, exist_ok=True)
                    elif member.isfile():
                        target.parent.mkdir(parents=True, exist_ok=True)
                        source = archive.extractfile(member)
                        assert source is not None
                        target.write_bytes(source.read())
                    else:
                        raise InstallError(f"the package holds a link or device: {member.name}")
            stamped = staging / "agent" / VERSION_FILE
            if not (staging / "agent" / "__main__.py").is_file() or not stamped.is_file():
                raise InstallError("not an agent package (no agent/__main__.py or agent/_version.py)")
            if f'VERSION = "{version}"' not in stamped.read_text():
                raise InstallError(f"the package is not version {version}")
        except (tarfile.TarError, OSError, EOFError) as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise InstallError(f"cannot unpack the package: {exc}") from exc
        except InstallError:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        final = self.version_dir(version)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(staging, final)
        return final

    def switch(self, target: Path | None) -> None:
        """Point `current` at `target` (None: back to the installed base code), atomically."""
        link = self.root / CURRENT
        if target is None:
            link.unlink(missing_ok=True)
            return
        temporary = self.root / f".{CURRENT}.{os.getpid()}"
        temporary.unlink(missing_ok=True)
        temporary.symlink_to(target.name)
        os.replace(temporary, link)

    def prune(self, keep: set[Path]) -> None:
        """Remove old version directories, keeping `keep` and the newest KEEP others."""
        others = sorted(
            (d for d in self.root.iterdir() if d.is_dir() and not d.name.startswith(".") and d not in keep),
            key=lambda d: d.stat().st_mtime,
        )
        for old in others[:-KEEP] if KEEP else others:
            shutil.rmtree(old, ignore_errors=True)

    # ---- the update marker

    def marker(self) -> UpdateMarker | None:
        try:
            return UpdateMarker(**json.loads((self.root / MARKER).read_text()))
        except (FileNotFoundError, ValueError, TypeError):
            return None

    def write_marker(self, marker: UpdateMarker) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        temporary = self.root / f".{MARKER}.{os.getpid()}"
        temporary.write_text(json.dumps(asdict(marker)))
        os.replace(temporary, self.root / MARKER)


def now() -> float:
    """Wall-clock time (the marker's deadline must survive a restart)."""
    return time.time()

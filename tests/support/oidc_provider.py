"""A real OpenID Connect provider as a second process: panva's oidc-provider (npm), run by
tests/support/oidc_provider/provider.mjs with only its documented configuration (clients, accounts found
by `findAccount`, development login and consent screens, RP-initiated logout).

Its node_modules come from `.ci/oidc-provider` (a cache outside the clone): OIDC_PROVIDER_MODULES when
.ci/test set it, else whatever that script cached.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from tests.support.processes import REPO_ROOT, ManagedProcess, free_port, port_open, wait_until

SCRIPT = REPO_ROOT / "tests" / "support" / "oidc_provider" / "provider.mjs"
CACHE = Path(os.environ.get("CLEVERTHIS_OIDC_PROVIDER_DIR", "/var/tmp/cleverthis-oidc-provider"))


def provider_modules() -> str | None:
    """The folder holding oidc-provider's node_modules, or None when it is not installed here."""
    configured = os.environ.get("OIDC_PROVIDER_MODULES", "")
    if configured:
        return configured
    installs = sorted(p.parent for p in CACHE.glob("modules-*/.complete"))
    return str(installs[-1]) if installs else None


class OidcProvider:
    """The provider process on 127.0.0.1:<port>; `issuer` is its URL. Stopped as a whole process group."""

    def __init__(self, log_dir: Path, *, clients: list[dict[str, Any]], accounts: dict[str, dict[str, Any]]) -> None:
        modules = provider_modules()
        node = shutil.which("node")
        if not modules or not node:
            raise RuntimeError("oidc-provider is not installed here (bash .ci/oidc-provider installs it)")
        self.port = free_port()
        self.issuer = f"http://127.0.0.1:{self.port}"
        config = json.dumps({"clients": clients, "accounts": accounts})
        env = {"OIDC_PROVIDER_MODULES": modules, "OIDC_PROVIDER_PORT": str(self.port), "OIDC_PROVIDER_CONFIG": config}
        self.process = ManagedProcess("oidc-provider", [node, str(SCRIPT)], log_dir=log_dir, env=env)
        wait_until(
            lambda: port_open(self.port) or not self.process.alive(), timeout=30, what="the OIDC provider to listen"
        )
        assert self.process.alive(), self.process.log()

    def stop(self) -> None:
        self.process.stop()

"""The `ctfleet` command line, on the SDK (`ctfleet.client`): one module per group of verbs, each adding its
verbs to the root group `cli` (`base`). Imports only click at start; the HTTP stack, YAML and rich load when a
verb needs them, so `ctfleet --help` starts fast.

Exit codes: 0 done, 1 failed, 2 bad input, 3 not found, 4 refused, 5 timed out, 6 server error or
unreachable, 7 not signed in (see ctfleet.errors).
"""

from __future__ import annotations

from ctfleet.cli import (  # noqa: F401  (each module adds its verbs to `cli`)
    apply,
    completion,
    describe,
    endpoint,
    get,
    keys,
    login,
    logs,
    nodes,
    ray,
    run,
    usage,
)
from ctfleet.cli.base import cli


def main() -> None:
    """The `ctfleet` console script."""
    cli(prog_name="ctfleet")


__all__ = ["cli", "main"]

"""Run inside a Ray head container: the cluster's status or a node drain, printed as one ``RAYJSON`` line.

The docker runtime runs ``python -c <program> ...`` in the head container, where `program` (see
`agent.ray.incontainer.program`) is the source of `agent.ray.gcs` followed by this file's: the container's
own Ray answers, whatever its version, and nothing of the agent needs installing there. Imported as a
module (tests, the agent itself) it takes `cluster_status` and `drain_node` from `agent.ray.gcs`.

This file must stay runnable after another module's source: no ``from __future__`` import (the program's
first one applies), and only the standard library besides the GCS functions.

Arguments: ``status <gcs port>`` or ``drain <gcs port> <node id> <message> <deadline s (0: none)>``.
"""

import json
import os
import sys
from collections.abc import Mapping
from typing import Any

if "cluster_status" not in globals():  # imported, not run after agent.ray.gcs's source
    from agent.ray.gcs import cluster_status, drain_node

MARKER = "RAYJSON"
# Written by `ray start` in the container's Ray temp dir (/tmp/ray): the address the head advertises.
CURRENT_CLUSTER_FILE = "/tmp/ray/ray_current_cluster"


def gcs_address(port: str, *, environ: Mapping[str, str] = os.environ, current: str = CURRENT_CLUSTER_FILE) -> str:
    """The head's GCS address: ``RAY_ADDRESS`` when set, else what the head advertises, else loopback."""
    if environ.get("RAY_ADDRESS"):
        return environ["RAY_ADDRESS"]
    try:
        with open(current) as found:
            return found.read().strip()
    except OSError:
        return "127.0.0.1:" + port


def answer(argv: list[str]) -> dict[str, Any]:
    """The JSON-able answer to one action (`argv` without the program name)."""
    if not argv:
        raise SystemExit("usage: status <gcs port> | drain <gcs port> <node id> <message> <deadline s>")
    action = argv[0]
    if action == "status" and len(argv) == 2:
        return cluster_status(gcs_address(argv[1])).as_dict()
    if action == "drain" and len(argv) == 5:
        deadline_s = float(argv[4]) or None
        accepted, message = drain_node(
            gcs_address(argv[1]), argv[2], reason="idle", message=argv[3], deadline_s=deadline_s
        )
        return {"accepted": accepted, "message": message}
    raise SystemExit(f"unknown action or wrong arguments: {' '.join(argv)}")


def render(result: dict[str, Any]) -> str:
    """The output line the agent looks for."""
    return MARKER + json.dumps(result)


def main(argv: list[str] | None = None) -> int:
    """Answer the action on the command line; the exit code is 0 once answered."""
    print(render(answer(sys.argv[1:] if argv is None else argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

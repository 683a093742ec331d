"""`run`: send a node command to one node or a whole cluster, and wait for it."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from ctfleet import errors
from ctfleet.cli.base import CONTEXT, OUTPUT, cli, state
from ctfleet.cli.lookup import find, resource_named


def _payload(payload: str | None, params: tuple[str, ...]) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if payload:
        try:
            body = json.loads(payload)
        except json.JSONDecodeError as exc:
            raise errors.InvalidInput(f"--payload is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise errors.InvalidInput("--payload must be a JSON object.")
    for pair in params:
        key, sep, value = pair.partition("=")
        if not sep:
            raise errors.InvalidInput(f"-p {pair!r} is not key=value.")
        try:
            body[key] = json.loads(value)
        except json.JSONDecodeError:
            body[key] = value
    return body


@cli.command(context_settings=CONTEXT)
@click.argument("cluster")
@click.argument("command_type")
@click.option("--node", help="One node (name or id); left out: every online node of the cluster.")
@click.option("--payload", help="The command's fields as a JSON object.")
@click.option(
    "-p", "params", multiple=True, metavar="KEY=VALUE", help="One payload field (value read as JSON if it is)."
)
@click.option("--wait", is_flag=True, help="Wait for every command to finish; exit 1 if one failed.")
@click.option("--timeout", type=float, default=300, show_default=True)
@click.option("-o", "--output", type=OUTPUT, default="table", show_default=True)
def run(
    cluster: str,
    command_type: str,
    node: str | None,
    payload: str | None,
    params: tuple[str, ...],
    wait: bool,
    timeout: float,
    output: str,
) -> None:
    """Send a node command (container.create, model.download, …) to one node or a whole cluster.

    \b
    Examples:
      ctfleet run lab container.create --node gpu-1 -p image=busybox -p name=web -p 'command=["sleep","60"]' --wait
      ctfleet run lab model.download -p model_id=acme/tiny --wait --timeout 900
    """
    from ctfleet import output as out

    client = state().client
    cluster_row = find(resource_named("clusters"), cluster)
    node_id = find(resource_named("nodes"), node)["id"] if node else None
    commands = [
        c.to_dict()
        for c in client.run_command(cluster_row["id"], command_type, _payload(payload, params), node_id=node_id)
    ]
    columns = ["id", "node_name", "command_type", "status", "error_code", "error_message"]
    if not wait:
        out.print_rows(commands, output, columns)
        return
    finished = []
    failed = False
    for command in commands:
        try:
            finished.append(client.wait_command(command["id"], timeout=timeout).to_dict())
        except errors.Failed as exc:
            finished.append(exc.obj)
            failed = True
    out.print_rows(finished, output, columns)
    if failed:
        sys.exit(errors.EXIT_FAILED)

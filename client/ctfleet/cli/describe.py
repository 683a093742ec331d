"""`describe`: one object in full, with its latest events."""

from __future__ import annotations

import sys

import click

from ctfleet.cli.base import CONTEXT, cli, complete_resource, state
from ctfleet.cli.lookup import find, resource_named


@cli.command(context_settings=CONTEXT)
@click.argument("kind", metavar="RESOURCE", shell_complete=complete_resource)
@click.argument("name")
def describe(kind: str, name: str) -> None:
    """Show everything about one object, with its latest events where it has an event log.

    \b
    Examples:
      ctfleet describe node gpu-1
      ctfleet describe endpoint acme-tiny-3f2a
      ctfleet describe raycluster train
    """
    from ctfleet import output as out

    res = resource_named(kind)
    obj = find(res, name)
    if sys.stdout.isatty():  # on a terminal: highlighted (rich is loaded only here)
        import io

        from rich.console import Console
        from rich.syntax import Syntax

        text = io.StringIO()
        out.dump_yaml(obj, text)
        Console().print(Syntax(text.getvalue(), "yaml", background_color="default"))
    else:
        out.dump_yaml(obj)
    events = {
        "nodes": "api/v1/nodes/{}/events/",
        "endpoints": "api/v1/endpoints/{}/events/",
        "rayclusters": "api/v1/ray/clusters/{}/events/",
    }.get(res.name)
    if events:
        page = state().client.get(events.format(obj["id"]), limit=10)
        rows = page.get("results", []) if isinstance(page, dict) else page
        if rows:
            click.echo("events:")
            for row in reversed(rows):
                click.echo(f"  {row.get('created_at', '')}  {row.get('kind', '')}  {row.get('message', '')}")

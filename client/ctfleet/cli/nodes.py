"""Node operations: `drain`, `cordon`, `uncordon`, `join-token` and a node's `events`."""

from __future__ import annotations

import click

from ctfleet.cli.base import CONTEXT, cli, state
from ctfleet.cli.logs import follow_events
from ctfleet.cli.lookup import find, resource_named


def _node_action(verb: str, node: str) -> None:
    row = find(resource_named("nodes"), node)
    answer = state().client.post(f"api/v1/nodes/{row['id']}/{verb}/")
    status = answer.get("status") if isinstance(answer, dict) else None
    click.echo(f"node {row['name']}: {status or verb + ' requested'}")


@cli.command(context_settings=CONTEXT)
@click.argument("node")
def drain(node: str) -> None:
    """Drain a node: no new work, its containers move elsewhere, then it is cordoned.

    \b
    Example:
      ctfleet drain gpu-1
    """
    _node_action("drain", node)


@cli.command(context_settings=CONTEXT)
@click.argument("node")
def cordon(node: str) -> None:
    """Cordon a node: what runs stays, nothing new is placed on it.

    \b
    Example:
      ctfleet cordon gpu-1
    """
    _node_action("cordon", node)


@cli.command(context_settings=CONTEXT)
@click.argument("node")
def uncordon(node: str) -> None:
    """Take a node back into service after cordon or drain.

    \b
    Example:
      ctfleet uncordon gpu-1
    """
    _node_action("uncordon", node)


@cli.command("join-token", context_settings=CONTEXT)
@click.argument("cluster")
def join_token(cluster: str) -> None:
    """Make a single-use join token (24 h) for CLUSTER and print the command a new node runs (shown once).

    \b
    Example:
      ctfleet join-token lab
    """
    row = find(resource_named("clusters"), cluster)
    answer = state().client.post(f"api/v1/clusters/{row['id']}/join-tokens/")
    click.echo(f"# expires {answer['expires_at']}; shown once")
    click.echo(answer["join_command"])


@cli.command(context_settings=CONTEXT)
@click.argument("node")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new events.")
@click.option("--tail", type=int, default=50, show_default=True, help="How many past events to show first.")
@click.option("--interval", type=float, default=2.0, show_default=True)
@click.option("--follow-timeout", type=float, default=None, help="Stop following after this many seconds.")
def events(node: str, follow: bool, tail: int, interval: float, follow_timeout: float | None) -> None:
    """A node's event log (connects, commands, state changes), oldest first.

    \b
    Example:
      ctfleet events gpu-1 -f
    """
    row = find(resource_named("nodes"), node)
    follow_events(f"api/v1/nodes/{row['id']}/events/", follow, interval, tail, follow_timeout)

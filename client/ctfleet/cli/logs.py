"""`logs` of a workload or an event log, and following either as it grows."""

from __future__ import annotations

import sys
from typing import Any

import click

from ctfleet import errors
from ctfleet.cli.base import CONTEXT, cli, complete_resource, state
from ctfleet.cli.lookup import find, resource_named


def follow_events(path: str, follow: bool, interval: float, limit: int, timeout: float | None) -> None:
    """Print an event log oldest first; with follow, keep printing new lines."""
    for row in state().client.follow_events(path, follow=follow, tail=limit, interval=interval, timeout=timeout):
        click.echo(f"{row.get('created_at', '')}  {row.get('kind', '')}  {row.get('message', '')}")
        sys.stdout.flush()


@cli.command(context_settings=CONTEXT)
@click.argument("kind", metavar="RESOURCE", shell_complete=complete_resource)
@click.argument("name")
@click.option("-f", "--follow", is_flag=True, help="Keep printing until it finishes.")
@click.option("--interval", type=float, default=2.0, show_default=True)
@click.option("--follow-timeout", type=float, default=None, help="Stop following after this many seconds.")
def logs(kind: str, name: str, follow: bool, interval: float, follow_timeout: float | None) -> None:
    """Logs of a training job or Tune experiment, or an endpoint's / Ray cluster's event log.

    \b
    Examples:
      ctfleet logs trainingjob finetune-1 -f
      ctfleet logs endpoint acme-tiny-3f2a -f
    """
    res = resource_named(kind)
    obj = find(res, name)
    if res.name in ("endpoints", "rayclusters"):
        prefix = "api/v1/endpoints/" if res.name == "endpoints" else "api/v1/ray/clusters/"
        follow_events(f"{prefix}{obj['id']}/events/", follow, interval, 50, follow_timeout)
        return
    if res.name not in ("trainingjobs", "tuneexperiments", "servedeployments"):
        raise errors.InvalidInput(
            f"{res.name} have no logs.",
            hint="Logs: trainingjobs, tuneexperiments, "
            "servedeployments, endpoints, rayclusters; a node's: `ctfleet events NODE`.",
        )
    follow_text(f"{res.path}{obj['id']}/", follow, interval, follow_timeout)


def follow_text(url: str, follow: bool, interval: float, timeout: float | None) -> None:
    """Print a workload's logs as they grow; exit 1 when it ended failed."""
    last: dict[str, Any] = {}
    for chunk, obj in state().client.follow_logs(url, follow=follow, interval=interval, timeout=timeout):
        last = obj
        if chunk:
            click.echo(chunk, nl=False)
            sys.stdout.flush()
    if last.get("status") == "failed":
        click.echo(f"\n{last.get('failure_reason') or 'failed'}", err=True)
        sys.exit(errors.EXIT_FAILED)

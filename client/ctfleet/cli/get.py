"""`get`: list a resource, or one object, once or as it changes (`--watch`)."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import click

from ctfleet.cli.base import CONTEXT, OUTPUT, cli, complete_resource
from ctfleet.cli.lookup import columns_for, find, list_rows, parse_filters, resource_named
from ctfleet.resources import Resource


@cli.command(context_settings=CONTEXT)
@click.argument("kind", metavar="RESOURCE", shell_complete=complete_resource)
@click.argument("name", required=False)
@click.option("-o", "--output", type=OUTPUT, default="table", show_default=True)
@click.option("-l", "--filter", "filters", multiple=True, metavar="KEY=VALUE", help="An API filter (status=online, …).")
@click.option("--watch", is_flag=True, help="Keep printing rows whose state changes (polls every --interval s).")
@click.option("--interval", type=float, default=2.0, show_default=True, help="Seconds between polls for --watch.")
@click.option("--watch-timeout", type=float, default=None, help="Stop watching after this many seconds (exit 0).")
def get(
    kind: str,
    name: str | None,
    output: str,
    filters: tuple[str, ...],
    watch: bool,
    interval: float,
    watch_timeout: float | None,
) -> None:
    """List RESOURCE (workspaces, clusters, nodes, commands, containers, endpoints, rayclusters, trainingjobs,
    tuneexperiments, servedeployments, apikeys, quotas, usage), or one of them by name or id.

    \b
    Examples:
      ctfleet get nodes
      ctfleet get nodes -l status=online -o wide
      ctfleet get endpoints -o json
      ctfleet get nodes --watch            # prints a node again whenever its row changes
      ctfleet get node gpu-1 -o yaml
    """
    from ctfleet import output as out

    res = resource_named(kind)
    query = parse_filters(filters, res)
    columns = columns_for(res, output)
    if name:
        rows: Any = [find(res, name)]
    else:
        rows = list_rows(res, query)
    if not watch:
        if output in ("json", "yaml") and name:
            (out.dump_json if output == "json" else out.dump_yaml)(rows[0])
            return
        out.print_rows(rows, output, columns)
        return
    _watch(res, name, query, output, columns, interval, watch_timeout)


def _watch(
    res: Resource,
    name: str | None,
    query: dict[str, str],
    output: str,
    columns: list[str],
    interval: float,
    timeout: float | None,
) -> None:
    """Print every row, then each row again whenever one of its shown fields changes."""
    from ctfleet import output as out

    seen: dict[str, tuple] = {}
    writer = out.TableWriter(["time", *columns]) if output in ("table", "wide") else None
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        rows = [find(res, name)] if name else list(list_rows(res, query))
        changed = []
        for row in rows:
            key = str(row.get("id") or row.get(res.name_field))
            signature = tuple(json.dumps(row.get(c), default=str) for c in columns)
            if seen.get(key) != signature:
                seen[key] = signature
                changed.append(row)
        if changed:
            stamp = time.strftime("%H:%M:%S")
            if writer is not None:
                writer.write([{"time": stamp, **row} for row in changed])
            else:
                for row in changed:
                    click.echo(json.dumps(row, default=str))
            sys.stdout.flush()
        if deadline is not None and time.monotonic() >= deadline:
            return
        time.sleep(interval)

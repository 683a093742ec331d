"""`usage`: requests, tokens and node/GPU hours per workspace, endpoint and key."""

from __future__ import annotations

from typing import Any

import click

from ctfleet.cli.base import CONTEXT, cli, state
from ctfleet.cli.lookup import find, resource_named, workspace_row

USAGE_COLUMNS = [
    "workspace_id",
    "subject_kind",
    "name",
    "api_key_name",
    "requests",
    "errors",
    "rate_limited",
    "prompt_tokens",
    "completion_tokens",
    "latency_ms_mean",
    "node_hours",
    "gpu_hours",
    "container_hours",
]


@cli.command(context_settings=CONTEXT)
@click.option("--period", type=click.Choice(["1h", "24h", "7d", "30d"]), default="24h", show_default=True)
@click.option("--endpoint", "endpoint_ref", help="Only this endpoint (slug or id).")
@click.option("--key-id", type=int, help="Only requests made with this API key (its id, from `ctfleet keys list`).")
@click.option("-o", "--output", type=click.Choice(["csv", "table", "json", "yaml"]), default="csv", show_default=True)
def usage(period: str, endpoint_ref: str | None, key_id: int | None, output: str) -> None:
    """Usage per workspace, endpoint and key for a period: requests, tokens, node/GPU hours (CSV by default).

    \b
    Examples:
      ctfleet usage --period 7d > usage.csv
      ctfleet -w demo usage --period 24h -o table
    """
    from ctfleet import output as out

    st = state()
    params: dict[str, Any] = {"period": period, "api_key": key_id}
    if st.workspace:
        params["workspace"] = workspace_row(st.workspace)["id"]
    if endpoint_ref:
        params["endpoint"] = find(resource_named("endpoints"), endpoint_ref)["id"]
    body = st.client.get("api/v1/usage/", **params)
    if output in ("json", "yaml"):
        (out.dump_json if output == "json" else out.dump_yaml)(body)
    elif output == "csv":
        out.print_csv(body["subjects"], USAGE_COLUMNS)
    else:
        out.print_rows(body["subjects"], "table", USAGE_COLUMNS[1:8])

"""`ray`: a Ray cluster's dashboard, and submitting a local script as a training job."""

from __future__ import annotations

import click

from ctfleet.cli.base import CONTEXT, Group, cli, state
from ctfleet.cli.logs import follow_text
from ctfleet.cli.lookup import find, resource_named


@cli.group(cls=Group, context_settings=CONTEXT)
def ray() -> None:
    """Ray clusters: the dashboard, submitting a script."""


@ray.command(context_settings=CONTEXT)
@click.argument("cluster")
@click.option("--open", "open_browser", is_flag=True, help="Open it in the browser (signs you in with a ticket).")
def dashboard(cluster: str, open_browser: bool) -> None:
    """Print (or open) the Ray Dashboard of CLUSTER. The link goes through the control plane, which hands
    your signed-in browser a single-use ticket for the dashboard's own origin.

    \b
    Example:
      ctfleet ray dashboard train --open
    """
    obj = find(resource_named("rayclusters"), cluster)
    url = state().client.url(obj["dashboard_url"])
    click.echo(url)
    if open_browser:
        import webbrowser

        webbrowser.open(url)


@ray.command(context_settings=CONTEXT)
@click.argument("script", type=click.Path(exists=True, dir_okay=False))
@click.option("--cluster", "ray_cluster", required=True, help="The Ray cluster (name or id).")
@click.option("--name", help="Job name (default: the script's file name).")
@click.option("--follow/--no-follow", default=True, show_default=True, help="Follow its logs until it ends.")
@click.option("--interval", type=float, default=2.0, show_default=True)
def submit(script: str, ray_cluster: str, name: str | None, follow: bool, interval: float) -> None:
    """Submit a local Python file as a training job and follow its logs; exit 1 if it fails.

    \b
    Example:
      ctfleet ray submit train.py --cluster train
    """
    from pathlib import Path

    obj = find(resource_named("rayclusters"), ray_cluster)
    job_name = name or Path(script).stem.replace("_", "-")[:63]
    body = {
        "workspace": obj["workspace"],
        "ray_cluster": obj["id"],
        "name": job_name,
        "kind": "script",
        "script": Path(script).read_text(),
    }
    job = state().client.post("api/v1/ray/training-jobs/", body)
    click.echo(f"training job {job['name']} ({job['id']}): {job['status']}", err=True)
    if follow:
        follow_text(f"api/v1/ray/training-jobs/{job['id']}/", True, interval, None)

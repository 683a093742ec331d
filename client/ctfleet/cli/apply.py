"""`apply` and `delete`: make what YAML manifests describe so (or undo it), after printing the plan."""

from __future__ import annotations

import sys
from collections.abc import Callable

import click

from ctfleet import errors
from ctfleet.cli.base import CONTEXT, cli, state


def _confirm(yes: bool, what: str) -> None:
    if yes:
        return
    if not sys.stdin.isatty():
        raise errors.InvalidInput(
            f"Not {what} without confirmation.", hint="Add --yes (or --dry-run to only see the plan)."
        )
    if not click.confirm(f"{what.capitalize()}?", default=False):
        raise errors.CtfleetError("Nothing done.")


def _manifest_command(
    files: tuple[str, ...], dry_run: bool, yes: bool, wait: bool, timeout: float, deleting: bool
) -> None:
    from ctfleet import manifests

    st = state()
    docs = manifests.load(files, st.workspace)
    steps = manifests.plan(st.client, docs, deleting=deleting)
    for step in steps:
        click.echo(step.line())
    refused = [s for s in steps if s.action == "refused"]
    pending = [s for s in steps if s.action in ("create", "update", "delete")]
    if refused:
        raise errors.InvalidInput(
            f"{len(refused)} change(s) cannot be made in place.",
            hint="Delete those objects first (`ctfleet delete -f FILE`), or leave those fields as they are.",
        ) from None
    if not pending:
        click.echo("Nothing to change.")
    elif dry_run:
        click.echo(f"Dry run: {len(pending)} change(s) not made.")
        return
    else:
        _confirm(yes, "deleting" if deleting else "applying")
    results = []
    for step in steps:
        obj = manifests.execute(st.client, step, deleting=deleting)
        results.append((step, obj))
        if step in pending:
            click.echo(f"{step.manifest.title}: {'deleted' if deleting else step.action + 'd'}")
    if wait and not deleting:
        for step, obj in results:
            waiting = manifests.waiter(st.client, step.manifest, obj or {})
            if waiting is not None:
                click.echo(f"Waiting for {step.manifest.title} to be ready…")
                done = waiting(timeout)
                click.echo(f"{step.manifest.title}: {done.get('status')}")


_manifest_options = [
    click.option("-f", "--filename", "files", multiple=True, required=True, help="A YAML file or a folder of them."),
    click.option("--dry-run", is_flag=True, help="Print the plan and change nothing."),
    click.option("-y", "--yes", is_flag=True, help="Do not ask before changing (needed without a terminal)."),
]


def _with(options: list[Callable]) -> Callable:
    def wrap(fn: Callable) -> Callable:
        for option in reversed(options):
            fn = option(fn)
        return fn

    return wrap


@cli.command(context_settings=CONTEXT)
@_with(_manifest_options)
@click.option("--wait", is_flag=True, help="Wait until what was applied is ready (running, succeeded).")
@click.option("--timeout", type=float, default=600, show_default=True, help="Seconds --wait waits.")
def apply(files: tuple[str, ...], dry_run: bool, yes: bool, wait: bool, timeout: float) -> None:
    """Create or update what the YAML describes (kinds: Cluster, Endpoint, RayCluster, TrainingJob,
    TuneExperiment, ServeDeployment, Quota). Prints the plan first; a second run changes nothing.

    \b
    Examples:
      ctfleet apply -f examples/ --dry-run
      ctfleet apply -f examples/endpoint.yaml --yes --wait --timeout 300
    """
    _manifest_command(files, dry_run, yes, wait, timeout, deleting=False)


@cli.command(context_settings=CONTEXT)
@_with(_manifest_options)
def delete(files: tuple[str, ...], dry_run: bool, yes: bool) -> None:
    """Delete (or stop, cancel, unset) what the YAML describes.

    \b
    Example:
      ctfleet delete -f examples/endpoint.yaml --yes
    """
    _manifest_command(files, dry_run, yes, False, 0, deleting=True)

"""The `ctfleet` command line, on the SDK (`ctfleet.client`). Imports only click at start; the HTTP stack,
YAML and rich load when a verb needs them, so `ctfleet --help` starts fast.

Exit codes: 0 done, 1 failed, 2 bad input, 3 not found, 4 refused, 5 timed out, 6 server error or
unreachable, 7 not signed in (see ctfleet.errors).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import click

from ctfleet import errors
from ctfleet.resources import RESOURCES, Resource, is_uuid, resource

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 110}
OUTPUT = click.Choice(["table", "wide", "json", "yaml", "name"])


class State:
    """What every verb shares: the profile chosen and, made on first use, the SDK client."""

    def __init__(self, profile: str | None, url: str | None, workspace: str | None) -> None:
        self.profile_name = profile
        self.url_override = url
        self.workspace_override = workspace
        self._client: Any = None
        self._profile: Any = None

    @property
    def profile(self) -> Any:
        if self._profile is None:
            from ctfleet import config

            self._profile = config.active_profile(self.profile_name)
            if self.url_override:
                self._profile.url = self.url_override
        return self._profile

    @property
    def workspace(self) -> str | None:
        return self.workspace_override or self.profile.workspace

    @property
    def client(self) -> Any:
        if self._client is None:
            profile = self.profile
            if not profile.url:
                raise errors.ConfigError("No control plane URL: not signed in.")
            if not profile.api_key:
                raise errors.ConfigError(f"No API key for profile {profile.name!r}.")
            from ctfleet.client import Client

            self._client = Client(profile.url, profile.api_key)
        return self._client


def complete_resource(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[str]:
    """Shell completion of RESOURCE arguments: the resource names."""
    return [r.name for r in RESOURCES if r.name.startswith(incomplete.lower())]


def state() -> State:
    return click.get_current_context().find_object(State)


def fail(error: errors.CtfleetError) -> None:
    """Print the error (the server's sentence) and what to do about it, and exit with its code."""
    message = error.message
    if isinstance(error, errors.ApiError) and error.status == 409 and "quota" in error.body:
        body = error.body
        message += f" (quota {body['quota']}: limit {body.get('limit')}, in use {body.get('in_use')}"
        message += f", asked {body.get('asked')})" if body.get("asked") is not None else ")"
    click.echo(f"Error: {message}", err=True)
    if error.hint:
        click.echo(f"  {error.hint}", err=True)
    sys.exit(error.exit_code)


class Group(click.Group):
    """A group that turns SDK errors into their message and exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except errors.CtfleetError as error:
            fail(error)
        except KeyboardInterrupt:
            sys.exit(130)


@click.group(cls=Group, context_settings=CONTEXT)
@click.option("--profile", envvar="CTFLEET_PROFILE", help="Sign-in profile to use (default: the current one).")
@click.option("--url", help="Control plane URL, overriding the profile's (or set CTFLEET_URL).")
@click.option("-w", "--workspace", help="Workspace (id, slug or name) for verbs that need one.")
@click.version_option(package_name="ctfleet", prog_name="ctfleet")
@click.pass_context
def cli(ctx: click.Context, profile: str | None, url: str | None, workspace: str | None) -> None:
    """Drive CleverThis Compute Fleet from a terminal, a script or a pipeline.

    \b
    Start with:
      ctfleet login --url https://fleet.example.com      # asks for an API key
      ctfleet get nodes
      ctfleet apply -f examples/endpoint.yaml --yes --wait
    """
    ctx.obj = State(profile, url, workspace)


# ---- sign-in -------------------------------------------------------------------------------------------


@cli.command(context_settings=CONTEXT)
@click.option("--url", "login_url", required=True, help="The control plane, e.g. https://fleet.example.com")
@click.option("--api-key", envvar="CTFLEET_API_KEY", help="The key (else CTFLEET_API_KEY, else asked for).")
@click.option("--profile", "profile_name", default=None, help="Save under this profile name (default: default).")
@click.option("-w", "--workspace", "login_workspace", help="Default workspace for this profile.")
def login(login_url: str, api_key: str | None, profile_name: str | None, login_workspace: str | None) -> None:
    """Check an API key against a control plane and keep it in ~/.config/ctfleet/config.yaml (mode 0600).

    \b
    Example:
      ctfleet login --url https://fleet.example.com            # prompts for the key
      CTFLEET_API_KEY=ctk_… ctfleet login --url http://127.0.0.1:8000 --profile dev
    """
    from ctfleet import config
    from ctfleet.client import Client

    if not api_key:
        api_key = click.prompt("API key (Settings → API keys)", hide_input=True)
    with Client(login_url, api_key) as client:
        workspaces = list(client.paginate("api/v1/workspaces/"))
    name = profile_name or os.environ.get("CTFLEET_PROFILE") or "default"
    path = config.store_profile(config.Profile(name, login_url.rstrip("/"), api_key, login_workspace))
    reach = ", ".join(w["slug"] for w in workspaces) or "no workspace"
    click.echo(f"Signed in to {login_url} as profile {name!r} (reaches {reach}); saved in {path}.")


@cli.command(context_settings=CONTEXT)
def whoami() -> None:
    """Show the control plane, the key in use (its name, scopes, workspace) and your workspaces.

    \b
    Example:
      ctfleet whoami
    """
    st = state()
    client = st.client
    key = st.profile.api_key or ""
    workspaces = list(client.paginate("api/v1/workspaces/"))
    mine = next((k for k in client.paginate("api/v1/api-keys/") if key.startswith(k["key_prefix"].rstrip("…."))), None)
    click.echo(f"URL:        {st.profile.url}")
    click.echo(f"Profile:    {st.profile.name}")
    if mine:
        click.echo(f"Key:        {mine['name']} ({mine['key_prefix']}), scopes {', '.join(mine['scopes'])}")
    for ws in workspaces:
        click.echo(f"Workspace:  {ws['slug']} ({ws['name']}), role {ws.get('role') or '-'}, id {ws['id']}")


# ---- get / describe ------------------------------------------------------------------------------------


def _resource(name: str) -> Resource:
    found = resource(name)
    if found is None:
        raise errors.InvalidInput(
            f"Unknown resource {name!r}.", hint=f"One of: {', '.join(r.name for r in RESOURCES)}."
        )
    return found


def _workspace_row(ref: str | None) -> dict[str, Any]:
    from ctfleet.manifests import Resolver

    return Resolver(state().client).workspace(ref)


def _filters(pairs: tuple[str, ...], res: Resource) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise errors.InvalidInput(
                f"Filter {pair!r} is not key=value.", hint=f"Filters of {res.name}: {res.filters}"
            )
        out[key] = value
    return out


def _rows(res: Resource, filters: dict[str, str]) -> Iterator[dict[str, Any]]:
    """Rows of a resource as printed (quotas and usage flattened into lines)."""
    client = state().client
    if res.name == "quotas":
        for ws in [_workspace_row(state().workspace)] if state().workspace else client.paginate("api/v1/workspaces/"):
            body = client.get(f"api/v1/workspaces/{ws['id']}/quotas/")
            for line in body["quotas"]:
                yield {"workspace": ws["slug"], **line}
        return
    if res.name == "usage":
        body = client.get(res.path, **filters)
        yield from body["subjects"]
        return
    if state().workspace and res.name in ("clusters",) and "workspace" not in filters:
        filters = {**filters, "workspace": _workspace_row(state().workspace)["id"]}
    yield from client.paginate(res.path, filters)


def find(res: Resource, ref: str) -> dict[str, Any]:
    """One object by id, or by name (slug for endpoints)."""
    client = state().client
    if res.name in ("quotas", "usage"):
        raise errors.InvalidInput(f"Use `ctfleet get {res.name}` for {res.name}.")
    if is_uuid(ref) or (res.name == "apikeys" and ref.isdigit()):
        return client.get(f"{res.path}{ref}/")
    params = {"q": ref} if "q" in res.filters else {}
    matches = [row for row in client.paginate(res.path, params) if row.get(res.name_field) == ref]
    if not matches:
        raise errors.NotFound(404, {"detail": f"No {res.name[:-1] if res.name.endswith('s') else res.name} {ref!r}."})
    if len(matches) > 1:
        ids = ", ".join(m["id"] for m in matches)
        raise errors.InvalidInput(f"{len(matches)} {res.name} are called {ref!r}: name one by id ({ids}).")
    return matches[0]


def _columns(res: Resource, output: str) -> list[str]:
    return [*res.columns, *(res.wide if output == "wide" else ())]


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

    res = _resource(kind)
    query = _filters(filters, res)
    columns = _columns(res, output)
    if name:
        rows: Any = [find(res, name)]
    else:
        rows = _rows(res, query)
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
        rows = [find(res, name)] if name else list(_rows(res, query))
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

    res = _resource(kind)
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


# ---- apply / delete ------------------------------------------------------------------------------------


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


# ---- node operations -----------------------------------------------------------------------------------


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
    cluster_row = find(_resource("clusters"), cluster)
    node_id = find(_resource("nodes"), node)["id"] if node else None
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


def _node_action(verb: str, node: str) -> None:
    row = find(_resource("nodes"), node)
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
    row = find(_resource("clusters"), cluster)
    answer = state().client.post(f"api/v1/clusters/{row['id']}/join-tokens/")
    click.echo(f"# expires {answer['expires_at']}; shown once")
    click.echo(answer["join_command"])


# ---- logs and events -----------------------------------------------------------------------------------


def _follow_events(path: str, follow: bool, interval: float, limit: int, timeout: float | None) -> None:
    """Print an event log oldest first; with follow, keep printing new lines."""
    for row in state().client.follow_events(path, follow=follow, tail=limit, interval=interval, timeout=timeout):
        click.echo(f"{row.get('created_at', '')}  {row.get('kind', '')}  {row.get('message', '')}")
        sys.stdout.flush()


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
    row = find(_resource("nodes"), node)
    _follow_events(f"api/v1/nodes/{row['id']}/events/", follow, interval, tail, follow_timeout)


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
    res = _resource(kind)
    obj = find(res, name)
    if res.name in ("endpoints", "rayclusters"):
        prefix = "api/v1/endpoints/" if res.name == "endpoints" else "api/v1/ray/clusters/"
        _follow_events(f"{prefix}{obj['id']}/events/", follow, interval, 50, follow_timeout)
        return
    if res.name not in ("trainingjobs", "tuneexperiments", "servedeployments"):
        raise errors.InvalidInput(
            f"{res.name} have no logs.",
            hint="Logs: trainingjobs, tuneexperiments, "
            "servedeployments, endpoints, rayclusters; a node's: `ctfleet events NODE`.",
        )
    _follow_text(f"{res.path}{obj['id']}/", follow, interval, follow_timeout)


def _follow_text(url: str, follow: bool, interval: float, timeout: float | None) -> None:
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


# ---- ray -----------------------------------------------------------------------------------------------


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
    obj = find(_resource("rayclusters"), cluster)
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

    obj = find(_resource("rayclusters"), ray_cluster)
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
        _follow_text(f"api/v1/ray/training-jobs/{job['id']}/", True, interval, None)


# ---- endpoints -----------------------------------------------------------------------------------------


@cli.group(cls=Group, context_settings=CONTEXT)
def endpoint() -> None:
    """Talk to an inference endpoint (OpenAI-compatible)."""


def _endpoint_client(ref: str, key: str | None, connect_to: str | None) -> tuple[dict[str, Any], Any]:
    """The endpoint and an HTTP client for its origin; `connect_to` (a URL) reaches the origin through that
    address instead of its DNS name (the Host header still names the endpoint), as curl's --connect-to."""
    from urllib.parse import urlsplit

    from ctfleet._httpx import httpx

    obj = find(_resource("endpoints"), ref)
    invoke_key = key or state().profile.api_key
    headers = {"Authorization": f"Bearer {invoke_key}"} if invoke_key else {}
    base = obj["url"].rstrip("/") + "/"
    if connect_to:
        headers["Host"] = urlsplit(obj["url"]).netloc
        base = connect_to.rstrip("/") + "/"
    return obj, httpx.Client(base_url=base, headers=headers, timeout=300)


_connect_option = click.option(
    "--connect-to",
    envvar="CTFLEET_CONNECT_TO",
    metavar="URL",
    help="Reach the endpoint's origin through this address (e.g. http://127.0.0.1:8000) with its name as Host.",
)


def _stream_chat(http: Any, body: dict[str, Any], path: str) -> str:
    """POST an OpenAI request with stream=true and print the tokens as they come; answers the whole text."""
    from ctfleet.errors import error_for

    text = []
    with http.stream("POST", path, json={**body, "stream": True}) as response:
        if response.status_code >= 400:
            response.read()
            try:
                detail = response.json()
            except ValueError:
                detail = {"detail": response.text}
            raise error_for(response.status_code, detail)
        for line in response.iter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            for choice in chunk.get("choices", []):
                piece = (choice.get("delta") or {}).get("content") or choice.get("text") or ""
                text.append(piece)
                click.echo(piece, nl=False)
                sys.stdout.flush()
    click.echo()
    return "".join(text)


@endpoint.command(context_settings=CONTEXT)
@_connect_option
@click.argument("ref", metavar="ENDPOINT")
@click.option("--prompt", help="A completion prompt (POST v1/completions).")
@click.option("--data", "data", help="A whole JSON request body; with --path, any OpenAI route.")
@click.option("--path", default=None, help="Route under the endpoint (default: v1/completions).")
@click.option("--max-tokens", type=int, default=64, show_default=True)
@click.option("--stream/--no-stream", default=True, show_default=True)
@click.option(
    "--key", envvar="CTFLEET_INVOKE_KEY", help="An invoke-scope key (else CTFLEET_INVOKE_KEY, else your key)."
)
def invoke(
    connect_to: str | None,
    ref: str,
    prompt: str | None,
    data: str | None,
    path: str | None,
    max_tokens: int,
    stream: bool,
    key: str | None,
) -> None:
    """Send one request to an endpoint and print the answer (streamed as it is generated).

    \b
    Examples:
      ctfleet endpoint invoke acme-tiny-3f2a --prompt "Hello"
      ctfleet endpoint invoke acme-tiny-3f2a --path v1/models --data '{}' --no-stream
    """
    obj, http = _endpoint_client(ref, key, connect_to)
    with http:
        body = json.loads(data) if data else {"prompt": prompt or "", "max_tokens": max_tokens}
        body.setdefault("model", obj["model_id"])
        route = (path or "v1/completions").lstrip("/")
        if stream and route.endswith("completions"):
            _stream_chat(http, body, route)
            return
        from ctfleet.errors import error_for

        response = http.post(route, json=body) if data or prompt is not None else http.get(route)
        if response.status_code >= 400:
            raise error_for(response.status_code, response.json() if response.content else {})
        click.echo(response.text)


@endpoint.command(context_settings=CONTEXT)
@_connect_option
@click.argument("ref", metavar="ENDPOINT")
@click.option("-m", "--message", "messages", multiple=True, help="Say this and exit (repeatable); else interactive.")
@click.option("--system", help="A system prompt.")
@click.option("--max-tokens", type=int, default=256, show_default=True)
@click.option(
    "--key", envvar="CTFLEET_INVOKE_KEY", help="An invoke-scope key (else CTFLEET_INVOKE_KEY, else your key)."
)
def chat(
    connect_to: str | None, ref: str, messages: tuple[str, ...], system: str | None, max_tokens: int, key: str | None
) -> None:
    """Chat with an endpoint (v1/chat/completions), streaming the answers; an empty line ends it.

    \b
    Examples:
      ctfleet endpoint chat acme-tiny-3f2a
      ctfleet endpoint chat acme-tiny-3f2a -m "Say hello"
    """
    obj, http = _endpoint_client(ref, key, connect_to)
    history: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
    with http:
        queue = list(messages)
        while True:
            if queue:
                said = queue.pop(0)
            elif messages:
                return
            else:
                said = click.prompt("you", default="", show_default=False)
                if not said:
                    return
            history.append({"role": "user", "content": said})
            answer = _stream_chat(
                http, {"model": obj["model_id"], "messages": history, "max_tokens": max_tokens}, "v1/chat/completions"
            )
            history.append({"role": "assistant", "content": answer})


# ---- usage and keys ------------------------------------------------------------------------------------

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
        params["workspace"] = _workspace_row(st.workspace)["id"]
    if endpoint_ref:
        params["endpoint"] = find(_resource("endpoints"), endpoint_ref)["id"]
    body = st.client.get("api/v1/usage/", **params)
    if output in ("json", "yaml"):
        (out.dump_json if output == "json" else out.dump_yaml)(body)
    elif output == "csv":
        out.print_csv(body["subjects"], USAGE_COLUMNS)
    else:
        out.print_rows(body["subjects"], "table", USAGE_COLUMNS[1:8])


@cli.group(cls=Group, context_settings=CONTEXT)
def keys() -> None:
    """Your API keys. Keys are listed with a key; creating and revoking them needs a signed-in session (the
    Settings → API keys page): a key cannot mint or revoke keys, so a leaked key cannot make more."""


@keys.command("list", context_settings=CONTEXT)
@click.option("-o", "--output", type=OUTPUT, default="table", show_default=True)
def keys_list(output: str) -> None:
    """List your API keys (never their secrets).

    \b
    Example:
      ctfleet keys list -o wide
    """
    from ctfleet import output as out

    res = _resource("apikeys")
    out.print_rows(state().client.paginate(res.path), output, _columns(res, output))


_KEY_REFUSAL = (
    "API keys are created and revoked while signed in: open Settings → API keys on {url}. A request made "
    "with an API key cannot mint or revoke keys (the server refuses it: {detail})"
)


def _key_refused(verb: str, call: Callable[[], Any]) -> None:
    try:
        call()
    except errors.Forbidden as exc:
        raise errors.Forbidden(
            403, {"detail": _KEY_REFUSAL.format(url=state().profile.url, detail=exc.message)}
        ) from None


@keys.command("create", context_settings=CONTEXT)
@click.argument("name")
@click.option("--scope", "scopes", multiple=True, type=click.Choice(["read", "operate", "invoke"]), default=("read",))
def keys_create(name: str, scopes: tuple[str, ...]) -> None:
    """Create a key (refused with a key: see `ctfleet keys --help`); the secret is printed once.

    \b
    Example:
      ctfleet -w demo keys create ci --scope read --scope operate
    """
    st = state()
    ws = _workspace_row(st.workspace)
    body = {"workspace": ws["id"], "name": name, "scopes": list(scopes)}
    result: dict[str, Any] = {}
    _key_refused("create", lambda: result.update(st.client.post("api/v1/api-keys/", body)))
    click.echo(result["key"])


@keys.command("revoke", context_settings=CONTEXT)
@click.argument("key_id")
def keys_revoke(key_id: str) -> None:
    """Revoke a key by id (refused with a key: see `ctfleet keys --help`).

    \b
    Example:
      ctfleet keys revoke 42
    """
    _key_refused("revoke", lambda: state().client.delete(f"api/v1/api-keys/{key_id}/"))
    click.echo(f"key {key_id} revoked")


# ---- completion ----------------------------------------------------------------------------------------


@cli.command(context_settings=CONTEXT)
@click.argument("shell", type=click.Choice(["bash", "zsh"]))
def completion(shell: str) -> None:
    """Print the shell completion script.

    \b
    Examples:
      ctfleet completion bash > ~/.local/share/bash-completion/completions/ctfleet
      echo 'eval "$(ctfleet completion zsh)"' >> ~/.zshrc
    """
    from click.shell_completion import get_completion_class

    cls = get_completion_class(shell)
    assert cls is not None
    click.echo(cls(cli, {}, "ctfleet", "_CTFLEET_COMPLETE").source())


def main() -> None:
    cli(prog_name="ctfleet")


if __name__ == "__main__":
    main()

"""Signing in: `login` keeps a checked key in a profile, `whoami` shows what it reaches."""

from __future__ import annotations

import os

import click

from ctfleet.cli.base import CONTEXT, cli, state


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

"""`keys`: list your API keys; creating and revoking them is refused with a key (the page does it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from ctfleet import errors
from ctfleet.cli.base import CONTEXT, OUTPUT, Group, cli, state
from ctfleet.cli.lookup import columns_for, resource_named, workspace_row


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

    res = resource_named("apikeys")
    out.print_rows(state().client.paginate(res.path), output, columns_for(res, output))


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
    ws = workspace_row(st.workspace)
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

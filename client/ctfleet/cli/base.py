"""What every verb shares: the root `cli` group, the profile and SDK client (`State`), errors turned into
their message and exit code (`Group`, `fail`), and the options many verbs take."""

from __future__ import annotations

import sys
from typing import Any

import click

from ctfleet import errors
from ctfleet.resources import RESOURCES

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

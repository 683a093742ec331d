"""Page forms of the endpoint pages: the rolling update's revision and server arguments (one shell-style line)."""

from __future__ import annotations

import shlex
from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from fleet.workloads.services import MAX_REVISION


def server_args_line(args: list[str]) -> str:
    """Server arguments as the one line the forms show (quoted as a shell would)."""
    return shlex.join(args)


def parse_server_args_line(line: str) -> list[str]:
    """One line of server arguments split as a shell would (`--max-model-len 2048 --dtype half`)."""
    try:
        return shlex.split(line)
    except ValueError as exc:
        raise ValidationError(f"Cannot parse the server arguments: {exc} (check the quotes).") from None


class EndpointUpdateForm(forms.Form):
    """A rolling update from the Endpoints page: the revision and server arguments to roll over to."""

    revision = forms.CharField(max_length=MAX_REVISION)
    server_args = forms.CharField(
        max_length=40_000,
        required=False,
        strip=True,
        label="Server arguments",
        help_text="vLLM arguments, shell-style, e.g. --max-model-len 2048 --gpu-memory-utilization 0.8",
    )

    def clean_server_args(self) -> list[str]:
        return parse_server_args_line(self.cleaned_data["server_args"])

    def changes(self) -> dict[str, Any]:
        """The service's keyword arguments."""
        return {"revision": self.cleaned_data["revision"], "server_args": self.cleaned_data["server_args"]}

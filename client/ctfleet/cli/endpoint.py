"""`endpoint`: talk to an inference endpoint (OpenAI-compatible): one request, or a chat."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from ctfleet.cli.base import CONTEXT, Group, cli, state
from ctfleet.cli.lookup import find, resource_named


@cli.group(cls=Group, context_settings=CONTEXT)
def endpoint() -> None:
    """Talk to an inference endpoint (OpenAI-compatible)."""


def _endpoint_client(ref: str, key: str | None, connect_to: str | None) -> tuple[dict[str, Any], Any]:
    """The endpoint and an HTTP client for its origin; `connect_to` (a URL) reaches the origin through that
    address instead of its DNS name (the Host header still names the endpoint), as curl's --connect-to."""
    from urllib.parse import urlsplit

    from ctfleet._httpx import httpx

    obj = find(resource_named("endpoints"), ref)
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

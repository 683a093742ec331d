"""Typed errors of the SDK, each carrying the server's JSON, and the exit code the command line gives it.

Exit codes scripts can trust: 0 done, 1 failed (a command or workload ended failed), 2 bad input (a 400,
or a manifest that does not validate), 3 not found, 4 refused (403, 409: a state or a quota said no),
5 timed out waiting, 6 server error or unreachable, 7 not signed in (no key, or the key is invalid,
expired or revoked).
"""

from __future__ import annotations

from typing import Any

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INVALID = 2
EXIT_NOT_FOUND = 3
EXIT_REFUSED = 4
EXIT_TIMEOUT = 5
EXIT_SERVER = 6
EXIT_AUTH = 7


class CtfleetError(Exception):
    """Base of every error the SDK raises; `exit_code` is what the command line exits with."""

    exit_code = EXIT_FAILED
    hint = ""

    def __init__(self, message: str, *, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        if hint:
            self.hint = hint


class ConfigError(CtfleetError):
    """No usable URL or API key (not signed in), or an unreadable config file."""

    exit_code = EXIT_AUTH
    hint = "Sign in with `ctfleet login --url URL` (or set CTFLEET_URL and CTFLEET_API_KEY)."


class InvalidInput(CtfleetError):
    """Input refused before it was sent (a manifest that does not validate, a bad flag value)."""

    exit_code = EXIT_INVALID


class WaitTimeout(CtfleetError):
    """A wait for a state ran out of time."""

    exit_code = EXIT_TIMEOUT
    hint = "Give it longer with --timeout, or look at `ctfleet describe` for why it is not ready."


class Failed(CtfleetError):
    """What was waited for ended in a failed state; `obj` is the last state seen."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str, obj: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.obj = obj or {}


class Unreachable(CtfleetError):
    """The control plane could not be reached (connection refused, DNS, TLS, timeouts after retries)."""

    exit_code = EXIT_SERVER
    hint = "Check the URL (`ctfleet whoami`) and that the control plane is up."


class ApiError(CtfleetError):
    """An HTTP error answer; `status` is its code and `body` the server's JSON (`detail`, field messages,
    `quota`, `limit`, …), or {"detail": text} when the answer was not JSON."""

    exit_code = EXIT_FAILED

    def __init__(self, status: int, body: Any, *, method: str = "", url: str = "") -> None:
        self.status = status
        self.body = body if isinstance(body, dict) else {"detail": body}
        self.method = method
        self.url = url
        super().__init__(describe_body(self.body) or f"HTTP {status}")

    def __getitem__(self, key: str) -> Any:
        return self.body[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.body.get(key, default)


class BadRequest(ApiError):
    """400: the server named what is wrong with the input, field by field."""

    exit_code = EXIT_INVALID


class Unauthorized(ApiError):
    """401: no key, or an invalid, expired or revoked one."""

    exit_code = EXIT_AUTH
    hint = "Create a key on the Settings → API keys page and sign in again with `ctfleet login`."


class Forbidden(ApiError):
    """403: the key or its owner's role may not do this; the server says why."""

    exit_code = EXIT_REFUSED


class NotFound(ApiError):
    """404: no such object in the workspaces this key reaches."""

    exit_code = EXIT_NOT_FOUND
    hint = "List what exists with `ctfleet get`."


class Conflict(ApiError):
    """409: a state machine or a quota refused the change (`quota`, `limit`, `in_use`, `asked` when a
    quota did)."""

    exit_code = EXIT_REFUSED


class RateLimited(ApiError):
    """429 still answered after the retries."""

    exit_code = EXIT_REFUSED
    hint = "Slow down, or raise the key's limits."


class ServerError(ApiError):
    """5xx (after the retries for 503)."""

    exit_code = EXIT_SERVER


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    429: RateLimited,
}


# Sign-in failures the server answers 403 rather than 401 (its first authentication scheme, the session,
# names no WWW-Authenticate challenge): these sentences are not a role's refusal but a key that does not work.
AUTH_FAILURES = (
    "Invalid, expired or revoked API key.",
    "Authentication credentials were not provided.",
    "Invalid token.",
)


def error_for(status: int, body: Any, *, method: str = "", url: str = "") -> ApiError:
    """The typed error of an HTTP error answer."""
    cls = _BY_STATUS.get(status) or (ServerError if status >= 500 else ApiError)
    if status == 403 and isinstance(body, dict) and body.get("detail") in AUTH_FAILURES:
        cls = Unauthorized
    return cls(status, body, method=method, url=url)


def describe_body(body: dict[str, Any]) -> str:
    """The server's sentence: its `detail`, else its field messages as `field: message` lines."""
    if isinstance(body.get("detail"), str):
        return body["detail"]
    parts = []
    for key, value in body.items():
        if isinstance(value, list):
            value = " ".join(str(v) for v in value)
        elif isinstance(value, dict):
            value = describe_body(value)
        parts.append(f"{key}: {value}")
    return "; ".join(parts)

"""Error types shared across the agent's subpackages.

`CommandFailed` is what every command handler (executors, the model cache, the endpoint manager, the Ray
backends, the updater) raises for a documented failure; the runner turns it into an `Error` frame.
"""

from __future__ import annotations

from typing import Any


class CommandFailed(Exception):
    """A command failed for a documented reason; `code` is one of `agent.protocol.ERROR_CODES`."""

    def __init__(self, code: str, message: str, **data: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


class RegistrationError(RuntimeError):
    """The control plane refused the join (bad/expired/used token, bad CSR) or could not be reached."""


__all__ = ["CommandFailed", "RegistrationError"]

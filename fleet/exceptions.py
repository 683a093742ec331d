"""Errors raised by fleet services; the API and pages turn them into 409/403 answers.

`IllegalTransition` (409), shared by every app, lives in `kernel.exceptions`.
"""

from __future__ import annotations


class JoinTokenRejected(Exception):
    """A join token that cannot register a node (unknown, used, expired, other cluster)."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.message = message
        self.code = code

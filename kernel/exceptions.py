"""Errors shared by every app's services; the API and pages turn them into 409 answers."""

from __future__ import annotations


class IllegalTransition(Exception):
    """A state change that the state machine refuses (HTTP 409); `str(err)` says why."""

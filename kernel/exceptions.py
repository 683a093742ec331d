"""Errors shared by every app's services; the API and pages turn them into 409 answers."""

from __future__ import annotations


class IllegalTransition(Exception):
    """A state change that the state machine refuses (HTTP 409); `str(err)` says why."""


class QuotaExceeded(IllegalTransition):
    """An admission the workspace's quota refuses (HTTP 409): which quota, its limit, what is in use and
    what was asked, in the quota's unit (`unit`: "" for counts, "GiB" for memory and VRAM)."""

    def __init__(self, *, quota: str, label: str, limit: float, in_use: float, asked: float, unit: str = "") -> None:
        self.quota, self.label, self.unit = quota, label, unit
        self.limit, self.in_use, self.asked = limit, in_use, asked
        suffix = f" {unit}" if unit else ""
        super().__init__(
            f"Quota exceeded: {label} is limited to {_num(limit)}{suffix} in this workspace; "
            f"{_num(in_use)}{suffix} in use, {_num(asked)}{suffix} asked."
        )

    def as_dict(self) -> dict[str, object]:
        """The refusal's fields, as the API answers them."""
        return {"quota": self.quota, "limit": self.limit, "in_use": self.in_use, "asked": self.asked}


def _num(value: float) -> str:
    """A number as people write it: 4, not 4.0; 1.5 stays 1.5."""
    return f"{value:g}" if isinstance(value, float) else str(value)

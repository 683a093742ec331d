"""Logs as an operator reads them: terminal escape codes and the jobs' internal marker lines removed.

Ray colours its log prefixes (``\\x1b[36m(pid=12)\\x1b[0m``) and our job programs print result markers,
lines ``CTFLEET {json}`` that the agent parses (`agent.ray.jobs.parse_markers`); neither is for reading.
Stored logs stay as the head sent them; pages show them through `console_text`.
"""

from __future__ import annotations

import re

# CSI sequences (colours, cursor moves), OSC sequences (titles, links) and the other two-byte escapes.
ANSI_ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
# A marker line, after Ray's optional "(Trainable pid=2, ip=10.0.0.1)" prefix.
MARKER_LINE = re.compile(r"^\s*(?:\([^)]*\)\s*)?CTFLEET ")


def strip_ansi(text: str) -> str:
    """`text` without terminal escape sequences."""
    return ANSI_ESCAPE.sub("", text)


def console_text(text: str | None) -> str:
    """Logs for a page: escape sequences removed and the ``CTFLEET`` marker lines dropped."""
    if not text:
        return ""
    lines = (line.removesuffix("\r") for line in strip_ansi(text).split("\n"))
    return "\n".join(line for line in lines if not MARKER_LINE.match(line))

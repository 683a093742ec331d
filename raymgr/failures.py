"""Why a Ray node failed, in the product's words ("Image pull failure", "Port conflict", "Insufficient
memory"), from a command's error code and message: one line for the cluster page, never a stack trace."""

from __future__ import annotations

_TITLES = {
    "image_pull_failed": "Image pull failure",
    "registry_auth_failed": "Image pull failure",
    "insufficient_memory": "Insufficient memory",
    "docker_unavailable": "Container engine unavailable",
    "unsupported": "Not supported on this node",
}
_HINTS = {
    "Image pull failure": "Check the image name, the registry credentials and the node's network.",
    "Port conflict": "Drain the node and retry.",
    "Insufficient memory": "The head node requires 4 GB free RAM minimum; free memory on the node or pick another.",
    "Container engine unavailable": "Check that Docker runs on the node.",
}
MAX_DETAIL = 300


def one_line(message: str, limit: int = MAX_DETAIL) -> str:
    """`message` on one line, a Python traceback reduced to its exception line, at most `limit` characters."""
    text = message or ""
    if "Traceback (most recent call last)" in text:
        before, _, tail = text.partition("Traceback (most recent call last)")
        lines = [line.strip() for line in tail.splitlines() if line.strip() and not line.startswith((" ", "\t"))]
        text = f"{before.strip()} {lines[-1] if lines else ''}"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def failure_title(code: str, message: str) -> str:
    """The product's name for a failure ('' when it has none)."""
    if code == "conflict" and "port" in (message or "").lower():
        return "Port conflict"
    return _TITLES.get(code, "")


def failure_text(code: str, message: str) -> str:
    """'<Title>: <detail>. <hint>' for documented failures, else '<code>: <detail>'."""
    title = failure_title(code, message)
    detail = one_line(message)
    if not title:
        return f"{code}: {detail}" if code else detail
    hint = _HINTS.get(title, "")
    return f"{title}: {detail.rstrip('.')}." + (f" {hint}" if hint else "")

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
    "Port conflict": (
        "Another program on the node listens on that port (a Redis on 6379, another Ray cluster, or a Ray node "
        "that is still stopping): stop it or choose another port, then start the cluster again."
    ),
    "Insufficient memory": "The head node requires 4 GB free RAM minimum; free memory on the node or pick another.",
    "Container engine unavailable": "Check that Docker runs on the node.",
}
# Ray itself refused one node's ports (two of its components on one port), e.g. an older agent's worker range.
_RAY_REFUSAL_HINT = (
    "Choose GCS and dashboard ports outside Ray's worker ports (10002-19999), or leave the GCS port empty so "
    "the node picks a free one, then start the cluster again."
)
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
    if title == "Port conflict" and "Ray refused to start" in (message or ""):
        hint = _RAY_REFUSAL_HINT
    return f"{title}: {detail.rstrip('.')}." + (f" {hint}" if hint else "")

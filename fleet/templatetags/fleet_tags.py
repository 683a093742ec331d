"""Small display filters for fleet pages, and the attributes of live (polling) fragments."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from django import template
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import mark_safe

from fleet import command_results, metrics_history

register = template.Library()


@register.filter
def gb(megabytes: int | float | None) -> str:
    """Megabytes as gigabytes with one decimal ("—" for nothing)."""
    if not megabytes:
        return "0"
    return f"{megabytes / 1024:.1f}"


@register.filter
def pct(value: float | None) -> str:
    """A percentage without decimals."""
    return f"{value or 0:.0f}%"


@register.filter
def ago(moment: dt.datetime | None) -> str:
    """How long ago `moment` was, in the largest whole unit ("12 s ago", "3 min ago"; "never" for nothing)."""
    if moment is None:
        return "never"
    seconds = max(0, int((timezone.now() - moment).total_seconds()))
    for unit, size in (("day", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            count = seconds // size
            return f"{count} {unit}{'s' if unit == 'day' and count != 1 else ''} ago"
    return f"{seconds} s ago"


@register.filter
def spark_json(values: list[float | None] | None) -> str:
    """One series as JSON for `data-sparkline` (autoescaped in the attribute)."""
    return json.dumps(values or [])


@register.filter
def spark_text(values: list[float | None] | None, label: str = "") -> str:
    """The text alternative of a series: its latest value and its range over the window."""
    seen = [v for v in values or [] if v is not None]
    if not seen:
        return f"{label}: no data yet".strip(": ")
    return f"{label}: latest {seen[-1]:.0f}%, min {min(seen):.0f}%, max {max(seen):.0f}%".lstrip(": ")


@register.inclusion_tag("fleet/_chart.html")
def utilization_chart(series: dict[str, list[float | None]], resolution: str, has_gpu: bool = True) -> dict[str, Any]:
    """A utilization chart (CPU, memory, and GPU/VRAM when the node has GPUs) with its text alternative."""
    ring = next(r for r in metrics_history.RESOLUTIONS if r.name == resolution)
    window = ring.label
    names = [n for n in metrics_history.SERIES if has_gpu or n in ("cpu", "memory")]
    labels = {n: metrics_history.SERIES_LABELS[n] for n in names}
    shown = {n: series.get(n, []) for n in names}
    rows = []
    length = max((len(v) for v in shown.values()), default=0)
    for i in range(length):
        values = [shown[n][i] if i < len(shown[n]) else None for n in names]
        if any(v is not None for v in values):
            rows.append(((length - 1 - i) * ring.step_s // 60, values))
    return {
        "spec": json.dumps({"series": shown, "labels": labels, "window": window}),
        "window": window,
        "summary": "; ".join(spark_text(shown[n], labels[n]) for n in names),
        "labels": [labels[n] for n in names],
        "rows": rows,
    }


@register.filter
def glance_total(glance: Any, attr: str) -> int:
    """A workspace glance's total of one cluster counter (`cleverthis.overview.WorkspaceGlance.total`)."""
    return glance.total(attr)


@register.simple_tag
def live(url: str, every: int | None, swap: str = "outerHTML") -> str:
    """The attributes of a live fragment: poll `url` every `every` seconds, or mark it settled."""
    if not every:
        return mark_safe('data-live="settled"')
    return format_html('hx-get="{}" hx-trigger="every {}s" hx-swap="{}" data-live="{}"', url, every, swap, every)


@register.filter
def last_line(text: str | None) -> str:
    """The last non-empty line of a (multi-line) message, e.g. a traceback's exception."""
    lines = [line for line in (text or "").splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


@register.filter
def multiline(text: str | None) -> bool:
    """Whether a message has more than one non-empty line."""
    return len([line for line in (text or "").splitlines() if line.strip()]) > 1


@register.filter
def url_breaks(url: str) -> str:
    """`url`, escaped, with a line-break opportunity (<wbr>) after its scheme and before each dot, so a
    narrow column breaks it between its names rather than anywhere."""
    scheme, sep, rest = str(url).partition("://")
    if not sep:
        scheme, rest = "", scheme
    parts = [format_html("{}", part) for part in rest.split(".")]
    head = format_html("{}://<wbr>", scheme) if sep else ""
    return mark_safe(head + "<wbr>.".join(parts))


@register.filter
def result_summary(result: dict[str, Any] | None) -> str:
    """A command's result in a few words (`fleet.command_results.result_summary`)."""
    return command_results.result_summary(result)


@register.filter
def agent_state(node: Any) -> str:
    """ "current", "update available" or "too old to update itself" for a node's agent ("" when unknown)."""
    from fleet import agent_updates

    if not node.agent_version:
        return ""
    if agent_updates.is_current(node):
        return "current"
    if 0 < node.protocol_version < agent_updates.UPDATABLE_FROM_PROTOCOL:
        return "too old to update itself: re-run the install script"
    return "update available"


@register.filter
def node_problems(node: Any) -> list[Any]:
    """What the node's connected agent cannot do, each with its fix (`fleet.node_problems`)."""
    from fleet import node_problems as problems

    return problems.node_problems(node)

"""The home page's pictures: a workspace's last hour as charts `static/js/charts.js` draws.

Each chart carries its own text alternative (a summary and a data table) so it reads without the
drawing. Built from `cleverthis.fleet_history` (no query of its own).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from kernel import timeseries

Buckets = list[dict[str, float]]
Series = list[float | None]


@dataclass
class Chart:
    """One chart: named series over the window (oldest first), their labels, a unit and a scale."""

    key: str
    title: str
    series: dict[str, Series]
    labels: dict[str, str]
    unit: str = ""  # "%", " ms" or "" (a count)
    max: float | None = None  # the top of the scale; None: fitted to the data
    empty: str = "Nothing recorded in the last hour yet."
    rows: list[tuple[int, list[float | None]]] = field(init=False)

    def __post_init__(self) -> None:
        length = max((len(v) for v in self.series.values()), default=0)
        self.rows = []
        for i in range(length):
            values = [v[i] if i < len(v) else None for v in self.series.values()]
            if any(x for x in values):
                self.rows.append(((length - 1 - i) * timeseries.STEP_S // 60, values))
        self.rows.reverse()  # the latest minute first

    @property
    def has_data(self) -> bool:
        """Whether any minute of the window has a value."""
        return any(v is not None for values in self.series.values() for v in values)

    @property
    def spec(self) -> str:
        """The JSON `data-chart` attribute charts.js draws."""
        return json.dumps(
            {"series": self.series, "labels": self.labels, "unit": self.unit, "max": self.max, "window": "last hour"}
        )

    def _fmt(self, value: float) -> str:
        return f"{value:.0f}{self.unit}" if self.unit else f"{value:g}"

    @property
    def summary(self) -> str:
        """The text alternative: per series its latest value and range over the hour."""
        if not self.has_data:
            return self.empty
        parts = []
        for name, values in self.series.items():
            seen = [v for v in values if v is not None]
            label = self.labels[name]
            if not seen:
                parts.append(f"{label}: no data")
            else:
                parts.append(
                    f"{label}: now {self._fmt(seen[-1])}, min {self._fmt(min(seen))}, max {self._fmt(max(seen))}"
                )
        return "; ".join(parts)

    @property
    def column_labels(self) -> list[str]:
        """The data table's column headings."""
        return [self.labels[n] + (f" ({self.unit.strip()})" if self.unit else "") for n in self.series]


def _measure(buckets: Buckets, measure: str, *, missing: float | None = None) -> Series:
    return [b.get(measure, missing) for b in buckets]


def workspace_charts(*, history: Buckets, commands: Buckets) -> list[Chart]:
    """The charts of one workspace from its rollups (`fleet_history`) and commands per minute."""
    sampled = [b if any(k.startswith("nodes.") for k in b) else {} for b in history]
    utilization = {name: _measure(history, f"util.{name}") for name in ("cpu", "memory", "gpu", "vram")}
    if not any(v is not None for v in utilization["gpu"] + utilization["vram"]):
        del utilization["gpu"], utilization["vram"]
    requests = _measure(history, "ep.requests", missing=0)
    latency_sum = _measure(history, "ep.latency_ms_sum")
    mean = [s / n if s is not None and n else None for s, n in zip(latency_sum, requests, strict=True)]
    return [
        Chart(
            "nodes",
            "Nodes by state",
            {s: _measure(sampled, f"nodes.{s}") for s in ("online", "offline", "cordoned", "draining")},
            {"online": "Online", "offline": "Offline", "cordoned": "Cordoned", "draining": "Draining"},
        ),
        Chart(
            "utilization",
            "Fleet utilization",
            utilization,
            {"cpu": "CPU", "memory": "Memory", "gpu": "GPU utilization", "vram": "VRAM"},
            unit="%",
            max=100,
            empty="No node reported in the last hour.",
        ),
        Chart(
            "commands",
            "Commands per minute",
            {
                "sent": _measure(commands, "commands.sent", missing=0),
                "failed": _measure(commands, "commands.failed", missing=0),
            },
            {"sent": "Commands", "failed": "Failed"},
        ),
        Chart(
            "requests",
            "Endpoint requests per minute",
            {"requests": requests, "errors": _measure(history, "ep.errors", missing=0)},
            {"requests": "Requests", "errors": "Errors (5xx)"},
        ),
        Chart(
            "latency",
            "Endpoint latency (time to first byte)",
            {"mean": mean, "max": _measure(history, "ep.latency_ms_max")},
            {"mean": "Mean", "max": "Slowest"},
            unit=" ms",
            empty="No endpoint request in the last hour.",
        ),
        Chart(
            "ray",
            "Ray clusters by state",
            {s: _measure(history, f"ray.{s}") for s in ("running", "pending", "failed", "stopped")},
            {"running": "Running", "pending": "Pending", "failed": "Failed", "stopped": "Stopped"},
        ),
    ]

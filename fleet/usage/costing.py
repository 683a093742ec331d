"""Costing usage at the prices in force: pure functions (no queries, no clock) over rollup rows and price versions.

A rollup row is costed at the price version in force at its bucket's start (the latest `effective_from` at
or before it; none: the row costs nothing and is marked unpriced). A cluster row costs its node-hours (the
cluster's own node price, else the default), GPU-hours per GPU model (the model's price, else the default
GPU price), CPU core-hours and GiB-hours; an endpoint row its prompt and completion tokens per million (the
endpoint's own prices, else the defaults). Amounts are `Decimal`s, rounded to 6 places per line.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

PLACES = Decimal("0.000001")
HOUR = Decimal(3600)
MILLION = Decimal(1_000_000)
MIB_PER_GIB = Decimal(1024)


def _dec(value: Any) -> Decimal:
    return value if isinstance(value, Decimal) else Decimal(str(value))


@dataclass(frozen=True)
class Prices:
    """One price version as the costing reads it."""

    effective_from: datetime
    currency: str = "USD"
    node_hour: Decimal = Decimal(0)
    cluster_node_hour: Mapping[str, Decimal] = field(default_factory=dict)
    gpu_hour: Decimal = Decimal(0)
    gpu_model_hour: Mapping[str, Decimal] = field(default_factory=dict)
    cpu_core_hour: Decimal = Decimal(0)
    memory_gib_hour: Decimal = Decimal(0)
    prompt_per_million: Decimal = Decimal(0)
    completion_per_million: Decimal = Decimal(0)
    endpoint_tokens: Mapping[str, Mapping[str, Decimal]] = field(default_factory=dict)

    @classmethod
    def of(cls, row: Any) -> Prices:
        """A `PriceVersion` row (or anything with its fields) as `Prices`."""
        return cls(
            effective_from=row.effective_from,
            currency=row.currency,
            node_hour=_dec(row.node_hour),
            cluster_node_hour={str(k): _dec(v) for k, v in (row.cluster_node_hour or {}).items()},
            gpu_hour=_dec(row.gpu_hour),
            gpu_model_hour={str(k): _dec(v) for k, v in (row.gpu_model_hour or {}).items()},
            cpu_core_hour=_dec(row.cpu_core_hour),
            memory_gib_hour=_dec(row.memory_gib_hour),
            prompt_per_million=_dec(row.prompt_per_million),
            completion_per_million=_dec(row.completion_per_million),
            endpoint_tokens={
                str(k): {part: _dec(price) for part, price in (v or {}).items()}
                for k, v in (row.endpoint_tokens or {}).items()
            },
        )


@dataclass(frozen=True)
class Line:
    """One priced quantity of one row: what, how much (in its unit), at what unit price, for how much."""

    item: str
    quantity: Decimal
    unit: str
    unit_price: Decimal
    amount: Decimal


def in_force(versions: Sequence[Prices], at: datetime) -> Prices | None:
    """The version in force at `at` (`versions` sorted by `effective_from`), or None before the first."""
    index = bisect.bisect_right([v.effective_from for v in versions], at) - 1
    return versions[index] if index >= 0 else None


def _line(item: str, quantity: Decimal, unit: str, price: Decimal) -> Line:
    return Line(item, quantity, unit, price.quantize(PLACES), (quantity * price).quantize(PLACES))


def row_lines(row: Mapping[str, Any], prices: Prices) -> list[Line]:
    """The priced lines of one rollup row (a dict of its columns) at `prices`; zero quantities left out."""
    subject = str(row["subject_id"])
    lines: list[Line] = []
    if row["subject_kind"] == "cluster":
        node_price = prices.cluster_node_hour.get(subject, prices.node_hour)
        lines.append(_line("Node-hours", Decimal(row.get("node_seconds") or 0) / HOUR, "h", node_price))
        by_model = {str(k): int(v) for k, v in (row.get("gpu_seconds_by_model") or {}).items()}
        rest = int(row.get("gpu_seconds") or 0) - sum(by_model.values())  # rows sampled before models were kept
        if rest > 0:
            by_model["GPU"] = by_model.get("GPU", 0) + rest
        for model, seconds in sorted(by_model.items()):
            price = prices.gpu_model_hour.get(model, prices.gpu_hour)
            lines.append(_line(f"GPU-hours ({model})", Decimal(seconds) / HOUR, "h", price))
        cores = Decimal(row.get("cpu_core_seconds") or 0) / HOUR
        lines.append(_line("CPU core-hours", cores, "core-h", prices.cpu_core_hour))
        gib = Decimal(row.get("memory_mib_seconds") or 0) / MIB_PER_GIB / HOUR
        lines.append(_line("Memory GiB-hours", gib, "GiB-h", prices.memory_gib_hour))
    else:
        own = prices.endpoint_tokens.get(subject, {})
        prompt = own.get("prompt", prices.prompt_per_million)
        completion = own.get("completion", prices.completion_per_million)
        lines.append(_line("Prompt tokens", Decimal(row.get("prompt_tokens") or 0) / MILLION, "M tokens", prompt))
        done = Decimal(row.get("completion_tokens") or 0) / MILLION
        lines.append(_line("Completion tokens", done, "M tokens", completion))
    return [line for line in lines if line.quantity]


def row_cost(row: Mapping[str, Any], versions: Sequence[Prices]) -> Decimal:
    """What one rollup row costs at the version in force at its bucket's start (0 when none was)."""
    prices = in_force(versions, row["bucket_start"])
    if prices is None:
        return Decimal(0)
    return sum((line.amount for line in row_lines(row, prices)), Decimal(0))

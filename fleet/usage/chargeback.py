"""Monthly chargeback statements: a workspace's usage of one calendar month (UTC) costed at the prices in
force hour by hour, one line per subject, item and unit price (a price change mid-month gives two lines)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

from fleet.usage import costing, selectors
from fleet.usage.models import Granularity, UsageRollup

CSV_COLUMNS = (
    "month",
    "workspace",
    "subject_kind",
    "subject",
    "api_key",
    "item",
    "quantity",
    "unit",
    "unit_price",
    "amount",
    "currency",
    "prices_from",
)


@dataclass(frozen=True)
class StatementLine:
    """What one subject (and API key) used of one item at one unit price, and what it costs."""

    subject_kind: str
    subject_id: Any
    name: str
    api_key_name: str
    item: str
    unit: str
    unit_price: Decimal
    prices_from: datetime
    quantity: Decimal
    amount: Decimal


@dataclass
class Statement:
    """A workspace's chargeback statement for one month."""

    workspace: Any
    month: date
    start: datetime
    end: datetime
    currency: str
    lines: list[StatementLine] = field(default_factory=list)
    total: Decimal = Decimal(0)
    unpriced: bool = False  # some usage came before the first price version (costs nothing)

    @property
    def label(self) -> str:
        return self.month.strftime("%Y-%m")


def month_bounds(month: date) -> tuple[datetime, datetime]:
    """[first instant, first instant of the next month) of `month`, in UTC."""
    start = datetime(month.year, month.month, 1, tzinfo=UTC)
    nxt = datetime(month.year + (month.month == 12), month.month % 12 + 1, 1, tzinfo=UTC)
    return start, nxt


def chargeback_statement(*, workspace: Any, month: date) -> Statement:
    """The statement of `workspace` for `month` from its hour rollups (4 queries and the price table)."""
    start, end = month_bounds(month)
    versions = selectors.price_versions()
    rows = UsageRollup.objects.filter(
        workspace=workspace, granularity=Granularity.HOUR, bucket_start__gte=start, bucket_start__lt=end
    )
    statement = Statement(workspace, month, start, end, versions[-1].currency if versions else "")
    sums: dict[tuple, list[Decimal]] = {}
    for row in rows.values(*selectors.COSTED).iterator(chunk_size=2000):
        prices = costing.in_force(versions, row["bucket_start"])
        if prices is None:
            statement.unpriced = True
            continue
        for line in costing.row_lines(row, prices):
            key = (row["subject_kind"], row["subject_id"], row["api_key_id"], line.item, line.unit, line.unit_price)
            key += (prices.effective_from,)
            total = sums.setdefault(key, [Decimal(0), Decimal(0)])
            total[0] += line.quantity
            total[1] += line.amount
    named = [{"subject_kind": k[0], "subject_id": k[1], "api_key_id": k[2]} for k in sums]
    selectors.name_subjects(named)
    for names, (key, (quantity, amount)) in zip(named, sums.items(), strict=True):
        statement.lines.append(
            StatementLine(
                subject_kind=key[0],
                subject_id=key[1],
                name=names["name"],
                api_key_name=names["api_key_name"],
                item=key[3],
                unit=key[4],
                unit_price=key[5],
                prices_from=key[6],
                quantity=quantity.quantize(costing.PLACES),
                amount=amount,
            )
        )
        statement.total += amount
    statement.lines.sort(key=lambda s: (s.subject_kind, s.name, s.api_key_name, s.item, s.prices_from))
    return statement


def csv_rows(statement: Statement, workspace_name: str) -> list[list[Any]]:
    """The statement as CSV rows (`CSV_COLUMNS`), its total last."""
    out: list[list[Any]] = []
    for line in statement.lines:
        out.append(
            [
                statement.label,
                workspace_name,
                line.subject_kind,
                line.name,
                line.api_key_name,
                line.item,
                line.quantity,
                line.unit,
                line.unit_price,
                line.amount,
                statement.currency,
                line.prices_from.isoformat(),
            ]
        )
    out.append(
        [statement.label, workspace_name, "", "", "", "Total", "", "", "", statement.total, statement.currency, ""]
    )
    return out

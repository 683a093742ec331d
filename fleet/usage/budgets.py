"""Budget writes: an Owner sets a workspace's (or one key's) monthly budget; the minute's evaluation measures
every budget's month from the usage rollups all web processes flush, alerts once per threshold and month
(audit log, the Owner's webhook; the Usage page's banner reads the stored level), and publishes the hard
stops every web process enforces (`budget_stops`)."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Sum

from audit.services import Target, entry_record, register_action
from fleet import enqueue
from fleet.usage import budget_stops, chargeback, costing, selectors
from fleet.usage.models import Budget, BudgetLevel, Granularity, SubjectKind, UsageRollup
from tenancy.models import ApiKey, Workspace
from tenancy.permissions import is_owner

ALERT = register_action("budget.alert", "workspace")
SET = register_action("budget.set", "workspace")
WEBHOOK_TASK = "fleet.usage.tasks.budget_webhook"
RANK = {BudgetLevel.OK: 0, BudgetLevel.WARNING: 1, BudgetLevel.EXCEEDED: 2}
WARN_AT = 0.8


def budget_set(
    *,
    actor: Any,
    workspace: Workspace,
    api_key: ApiKey | None = None,
    token_limit: int | None = None,
    money_limit: Decimal | None = None,
    hard_stop: bool = False,
    webhook_url: str = "",
) -> Budget:
    """Set (create or replace) the monthly budget of `workspace`, or of its key `api_key` (Owners only)."""
    if not is_owner(actor, workspace):
        raise PermissionDenied("Only the workspace's Owners set its budgets.")
    errors: dict[str, str] = {}
    if api_key is not None and api_key.workspace_id != workspace.pk:
        errors["api_key"] = "No such API key in this workspace."
    if token_limit is None and money_limit is None:
        errors["token_limit"] = "Set a token limit, a money limit, or both."
    with transaction.atomic():
        budget = Budget.objects.select_for_update().filter(workspace=workspace, api_key=api_key).first()
        budget = budget or Budget(workspace=workspace, api_key=api_key, created_by=actor)
        budget.token_limit, budget.money_limit = token_limit, money_limit
        budget.hard_stop, budget.webhook_url = hard_stop, webhook_url or ""
        try:
            budget.full_clean(exclude=["workspace", "api_key", "created_by"], validate_constraints=False)
        except ValidationError as exc:
            for name, messages in exc.message_dict.items():
                errors.setdefault(name, " ".join(messages))
        if errors:
            raise ValidationError(errors)
        budget.save()
        detail = {"api_key": api_key.pk if api_key else None, "token_limit": token_limit, "hard_stop": hard_stop}
        detail["money_limit"] = str(money_limit) if money_limit is not None else None
        entry_record(name=SET, actor=actor, target=_target(workspace), detail=detail)
    return budget


def budget_delete(*, actor: Any, budget: Budget) -> None:
    """Remove a budget (Owners only); its stop lifts with the next evaluation."""
    if not is_owner(actor, budget.workspace):
        raise PermissionDenied("Only the workspace's Owners set its budgets.")
    budget.delete()


def _target(workspace: Workspace) -> Target:
    return Target("workspace", str(workspace.pk), workspace.name, workspace.pk)


def _spend(budget: Budget, start: datetime, end: datetime, versions: list[costing.Prices]) -> tuple[int, Decimal]:
    rows = UsageRollup.objects.filter(
        workspace_id=budget.workspace_id, granularity=Granularity.HOUR, bucket_start__gte=start, bucket_start__lt=end
    )
    if budget.api_key_id is not None:
        rows = rows.filter(subject_kind=SubjectKind.ENDPOINT, api_key_id=budget.api_key_id)
    sums = rows.aggregate(p=Sum("prompt_tokens"), c=Sum("completion_tokens"))
    tokens = (sums["p"] or 0) + (sums["c"] or 0)
    money = Decimal(0)
    if budget.money_limit is not None:
        money = selectors.usage_costs(rows=rows, versions=versions).total
    return tokens, money


def _level(shares: dict[str, float]) -> str:
    top = max(shares.values(), default=0.0)
    return BudgetLevel.EXCEEDED if top >= 1 else BudgetLevel.WARNING if top >= WARN_AT else BudgetLevel.OK


def refusal_of(budget: Budget) -> dict[str, Any]:
    """The JSON error a stopped budget's requests get (429)."""
    shares = budget.shares()
    over = ", ".join(f"{name} {share:.0%}" for name, share in shares.items())
    return {
        "type": "budget_exceeded",
        "budget": budget.name,
        "budget_id": budget.pk,
        "month": budget.month,
        "token_limit": budget.token_limit,
        "money_limit": str(budget.money_limit) if budget.money_limit is not None else None,
        "message": f"{budget.name[0].upper()}{budget.name[1:]} for {budget.month} is used up ({over}); "
        "requests are refused until the month ends or an Owner raises it.",
    }


def budgets_evaluate(*, now: datetime | None = None) -> int:
    """Measure every budget's month, alert on a threshold crossed, publish the hard stops; returns how many
    budgets stop requests now."""
    now = now or datetime.now(UTC)
    month = now.strftime("%Y-%m")
    start, end = chargeback.month_bounds(now.date())
    versions = selectors.price_versions()
    stops: dict[str, dict[str, Any]] = {}
    for budget in Budget.objects.select_related("workspace").order_by("pk"):
        tokens, money = _spend(budget, start, end, versions)
        before = budget.level if budget.month == month else BudgetLevel.OK
        budget.month, budget.spent_tokens, budget.spent_money, budget.evaluated_at = month, tokens, money, now
        budget.level = _level(budget.shares())
        with transaction.atomic():
            Budget.objects.filter(pk=budget.pk).update(
                month=month, spent_tokens=tokens, spent_money=money, level=budget.level, evaluated_at=now
            )
            if RANK[budget.level] > RANK[before]:
                _alert(budget)
        if budget.hard_stop and budget.level == BudgetLevel.EXCEEDED:
            key = budget_stops.scope_key(workspace_id=budget.workspace_id, api_key_id=budget.api_key_id)
            stops[key] = refusal_of(budget)
    budget_stops.publish(stops)
    return len(stops)


def _alert(budget: Budget) -> None:
    """One alert for the threshold `budget.level` reached this month: the audit log and the webhook."""
    percent = 100 if budget.level == BudgetLevel.EXCEEDED else 80
    payload = {
        "event": "budget.alert",
        "threshold_percent": percent,
        "workspace": str(budget.workspace_id),
        "api_key": budget.api_key_id,
        "budget": budget.name,
        "month": budget.month,
        "spent_tokens": budget.spent_tokens,
        "token_limit": budget.token_limit,
        "spent_money": str(budget.spent_money),
        "money_limit": str(budget.money_limit) if budget.money_limit is not None else None,
        "hard_stop": budget.hard_stop,
    }
    entry_record(name=ALERT, actor=None, target=_target(budget.workspace), detail=payload)
    if budget.webhook_url:
        enqueue.on_commit(WEBHOOK_TASK, budget.webhook_url, payload)

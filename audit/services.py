"""Writes of the audit trail: one entry per operator action, in the action's own transaction.

`operator_action(...)` decorates an operator service and takes the place of its `@transaction.atomic`:

- The service runs in one transaction; when it returns, its entry is written in that same
  transaction, so the entry commits or rolls back with the action. The outcome is `ok`, or `pending`
  when the action sent commands to nodes: each command points at the entry (`Command.audit_entry`)
  and `entry_settle` makes it `ok` or `failed` once they finished (with the Git commit an argocd-mode
  agent reports for a deploy).
- A refusal (Django's PermissionDenied or ValidationError, `IllegalTransition` and its subclasses)
  raises before anything is written and rolls the action back; the `refused` entry with the reason is
  written after that rollback. When the caller holds a transaction of its own that later rolls back
  too, that entry goes with it.
- A decorated service called while another operator action runs is part of that action: it gets no
  entry of its own (e.g. the commands a Ray cluster start sends belong to `ray_cluster.start`).
- Automatic work (drains, the Ray autoscaler, follow-ups of command outcomes) calls no decorated
  service and writes no entry.
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import DatabaseError, transaction
from django.db.models import Case, CharField, DateTimeField, F, TextField, Value, When
from django.utils import timezone

from audit.models import AuditEntry, Outcome
from kernel.exceptions import IllegalTransition
from tenancy.models import Workspace

logger = logging.getLogger(__name__)

REFUSALS: tuple[type[Exception], ...] = (PermissionDenied, ValidationError, IllegalTransition)
# Every audited action name and target type, filled in as the services are decorated (the page's
# filters list them).
ACTIONS: set[str] = set()
TARGET_TYPES: set[str] = set()
MAX_REASON = 2000
FnT = TypeVar("FnT", bound=Callable[..., Any])


@dataclass(frozen=True)
class Target:
    """What an action is about: a type (`cluster`, `node`, ...), its id and name, and its workspace."""

    type: str
    id: str = ""
    name: str = ""
    workspace_id: Any = None


def workspace_id_of(obj: Any) -> Any:
    """The workspace of a row: its own `workspace_id`, else its cluster's (nodes, endpoints, commands)."""
    if hasattr(obj, "workspace_id"):
        return obj.workspace_id
    return obj.cluster.workspace_id


def target_of(obj: Any, type_: str) -> Target:
    """A row as a target."""
    name = getattr(obj, "name", None) or getattr(obj, "slug", None) or ""
    return Target(type_, str(obj.pk or ""), str(name)[:255], workspace_id_of(obj))


def on(kwarg: str, type_: str) -> Callable[[Mapping[str, Any]], Target]:
    """The target is the row passed as keyword `kwarg` (read before the action runs)."""
    TARGET_TYPES.add(type_)
    return lambda kwargs: target_of(kwargs[kwarg], type_)


def new(type_: str, *, name: str = "name", within: str = "workspace") -> Callable[[Mapping[str, Any]], Target]:
    """The target is a row the action creates, named by keyword `name`, in the workspace of keyword
    `within` (a workspace, or a row of one)."""
    TARGET_TYPES.add(type_)

    def target(kwargs: Mapping[str, Any]) -> Target:
        place = kwargs[within]
        workspace_id = place.pk if isinstance(place, Workspace) else workspace_id_of(place)
        return Target(type_, "", str(kwargs.get(name) or "")[:255], workspace_id)

    return target


def created(type_: str, pick: Callable[[Any], Any] = lambda value: value) -> Callable[[Any, Target], Target]:
    """After success the target is the row the service returned (`pick` finds it in the return value)."""
    return lambda value, before: target_of(pick(value), type_)


@dataclass
class _Action:
    id: uuid.UUID
    at: Any
    sent_commands: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


_current: ContextVar[_Action | None] = ContextVar("cleverthis_audit_action", default=None)


def entry_for_commands() -> uuid.UUID | None:
    """The entry of the operator action in progress, for the commands it is sending (None outside one).

    Its entry becomes `pending` and follows those commands (`entry_settle`).
    """
    action = _current.get()
    if action is None:
        return None
    action.sent_commands = True
    return action.id


def reason_of(exc: Exception) -> str:
    """A refusal as one line of text: field messages as `field: message`."""
    if isinstance(exc, ValidationError):
        if hasattr(exc, "error_dict"):
            text = "; ".join(f"{name}: {' '.join(messages)}" for name, messages in exc.message_dict.items())
        else:
            text = " ".join(exc.messages)
    else:
        text = str(exc) or type(exc).__name__
    return text[:MAX_REASON]


def _entry(action: _Action, name: str, actor: Any, target: Target, **fields: Any) -> AuditEntry:
    return AuditEntry(
        id=action.id,
        workspace_id=target.workspace_id,
        actor_id=getattr(actor, "pk", None),
        actor_name=actor.get_username() if getattr(actor, "is_authenticated", False) else "",
        action=name,
        target_type=target.type,
        target_id=target.id,
        target_name=target.name,
        created_at=action.at,
        **fields,
    )


def operator_action(
    name: str,
    *,
    target: Callable[[Mapping[str, Any]], Target],
    result: Callable[[Any, Target], Target] | None = None,
    detail: Callable[[Mapping[str, Any], Any], dict[str, Any]] | None = None,
) -> Callable[[FnT], FnT]:
    """Decorate the keyword-only operator service `name` (e.g. `node.cordon`) so that it is audited.

    `target(kwargs)` names what the action is about, read before it runs (so a deleted row keeps its
    name); `result(value, before)` replaces it after success (the row an action created); `detail(kwargs,
    value)` adds structured facts (value is None for a refusal). The service gets its transaction here.
    """

    ACTIONS.add(name)

    def decorate(fn: FnT) -> FnT:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if _current.get() is not None:  # part of the operator action in progress
                with transaction.atomic():
                    return fn(*args, **kwargs)
            before = target(kwargs)
            action = _Action(id=uuid.uuid4(), at=timezone.now())
            token = _current.set(action)
            try:
                with transaction.atomic():
                    try:
                        value = fn(*args, **kwargs)
                    finally:
                        _current.reset(token)  # before the commit: on_commit work is not this action
                    after = result(value, before) if result else before
                    _entry(
                        action,
                        name,
                        kwargs.get("actor"),
                        after,
                        outcome=Outcome.PENDING if action.sent_commands else Outcome.OK,
                        detail=detail(kwargs, value) if detail else {},
                        finished_at=None if action.sent_commands else action.at,
                    ).save(force_insert=True)
            except REFUSALS as exc:
                _record_refusal(action, name, kwargs, before, exc, detail)
                raise
            return value

        wrapper.audited_action = name  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate


def _record_refusal(
    action: _Action,
    name: str,
    kwargs: Mapping[str, Any],
    target: Target,
    exc: Exception,
    detail: Callable[[Mapping[str, Any], Any], dict[str, Any]] | None,
) -> None:
    """Write the `refused` entry after the action rolled back; never hides the refusal itself."""
    try:
        with transaction.atomic():
            _entry(
                action,
                name,
                kwargs.get("actor"),
                target,
                outcome=Outcome.REFUSED,
                reason=reason_of(exc),
                detail=detail(kwargs, None) if detail else {},
                finished_at=action.at,
            ).save(force_insert=True)
    except (DatabaseError, AttributeError, KeyError, TypeError):
        logger.exception("could not record the refusal of %s", name)


def entry_record(*, name: str, actor: Any, target: Target, detail: dict[str, Any] | None = None) -> AuditEntry:
    """Write an `ok` entry for something that happened outside an operator service (a single sign-on
    changing memberships), in the caller's transaction. `name` must have been registered with
    `register_action`."""
    action = _Action(id=uuid.uuid4(), at=timezone.now())
    entry = _entry(action, name, actor, target, outcome=Outcome.OK, detail=detail or {}, finished_at=action.at)
    entry.save(force_insert=True)
    return entry


def register_action(name: str, target_type: str) -> str:
    """Make `name` (acting on `target_type`) known to the audit page's filters; returns `name`."""
    ACTIONS.add(name)
    TARGET_TYPES.add(target_type)
    return name


def entry_settle(*, entry_id: uuid.UUID, failure: str = "", done: bool = False, git_commit: str = "") -> None:
    """Follow the commands of a `pending` entry: `failure` makes it `failed` (the first one counts),
    `done` (all finished, none failed) makes it `ok`; `git_commit` is kept if none was yet. One UPDATE."""
    now = timezone.now()
    fields: dict[str, Any] = {}
    if failure or done:
        outcome = Outcome.FAILED if failure else Outcome.OK
        pending = {"outcome": Outcome.PENDING}
        fields["outcome"] = Case(When(**pending, then=Value(outcome)), default=F("outcome"), output_field=CharField())
        fields["finished_at"] = Case(
            When(**pending, then=Value(now)), default=F("finished_at"), output_field=DateTimeField()
        )
        if failure:
            fields["reason"] = Case(
                When(**pending, then=Value(failure[:MAX_REASON])), default=F("reason"), output_field=TextField()
            )
    if git_commit:
        fields["git_commit"] = Case(
            When(git_commit="", then=Value(git_commit[:64])), default=F("git_commit"), output_field=CharField()
        )
    if fields:
        AuditEntry.objects.filter(pk=entry_id).update(**fields)

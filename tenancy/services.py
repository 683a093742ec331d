"""Writes for workspaces, memberships and quotas; memberships keep guardian permissions in step with the role."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.text import slugify
from guardian.shortcuts import assign_perm, remove_perm

from tenancy import sso
from tenancy.models import Membership, Role, SsoIdentity, Workspace, WorkspaceQuota
from tenancy.permissions import EDIT_PERM, OPERATE_PERM, VIEW_PERM, is_owner
from tenancy.quotas import BY_NAME, locked_quota
from tenancy.signals import membership_removed, quota_changed, sso_memberships_changed

logger = logging.getLogger(__name__)

MAX_LIMIT = 1_000_000


def _sync_permissions(membership: Membership) -> None:
    """Grant exactly the guardian permissions that `membership.role` implies, and revoke the rest."""
    user, workspace, role = membership.user, membership.workspace, membership.role
    wanted = {
        VIEW_PERM: True,
        EDIT_PERM: role in Role.editors(),
        OPERATE_PERM: role in Role.operators(),
    }
    for perm, granted in wanted.items():
        (assign_perm if granted else remove_perm)(perm, user, workspace)


@transaction.atomic
def workspace_create(*, name: str, owner: AbstractBaseUser, slug: str | None = None) -> Workspace:
    """Create a workspace with `owner` as its Owner."""
    workspace = Workspace.objects.create(name=name, slug=slug or slugify(name))
    WorkspaceQuota.objects.create(workspace=workspace)  # every limit empty: unlimited
    membership_set(workspace=workspace, user=owner, role=Role.OWNER)
    return workspace


@transaction.atomic
def membership_set(
    *, workspace: Workspace, user: AbstractBaseUser, role: Role | str, granted_by_sso: bool = False
) -> Membership:
    """Add `user` to `workspace` with `role`, or change their role if already a member; a membership set
    by hand (`granted_by_sso` False) is no longer the single sign-on mapping's to change."""
    membership, _ = Membership.objects.update_or_create(
        user=user, workspace=workspace, defaults={"role": Role(role), "granted_by_sso": granted_by_sso}
    )
    _sync_permissions(membership)
    return membership


@transaction.atomic
def membership_remove(*, workspace: Workspace, user: AbstractBaseUser) -> None:
    """Remove `user` from `workspace` and revoke every workspace permission they held."""
    Membership.objects.filter(user=user, workspace=workspace).delete()
    for perm in (VIEW_PERM, EDIT_PERM, OPERATE_PERM):
        remove_perm(perm, user, workspace)
    membership_removed.send(sender=Membership, workspace=workspace, user=user)


@dataclass(frozen=True)
class MembershipChange:
    """One membership the single sign-on mapping created (`before` None), changed, or removed (`after` None)."""

    workspace: Workspace
    membership_id: int | None
    before: str | None
    after: str | None


@transaction.atomic
def sso_sign_in(
    *,
    issuer: str,
    subject: str,
    claims: Mapping[str, Any],
    mapping: Iterable[tuple[str, str, str]],
    groups_claim: str = "groups",
    username_claim: str = "preferred_username",
) -> AbstractBaseUser:
    """The user of the OpenID Connect account `issuer`/`subject`, created at its first sign-in, with
    e-mail and names refreshed from `claims` and memberships brought in line with the claim mapping.

    Users are matched by issuer and subject only (never by e-mail). The mapping grants, changes and
    removes only memberships it granted itself; mapped workspaces that do not exist are skipped with a
    warning. Each change is announced by `sso_memberships_changed` in this transaction (the audit trail).
    """
    now = timezone.now()
    values = sso.claim_values(claims, groups_claim)
    identity = (
        SsoIdentity.objects.select_for_update().select_related("user").filter(issuer=issuer, subject=subject).first()
    )
    if identity is None:
        try:
            with transaction.atomic():  # a savepoint: two first sign-ins of one subject at once
                user = get_user_model().objects.create_user(_free_username(sso.username_base(claims, username_claim)))
                identity = SsoIdentity.objects.create(user=user, issuer=issuer, subject=subject, last_sign_in_at=now)
        except IntegrityError:
            identity = (
                SsoIdentity.objects.select_for_update().select_related("user").get(issuer=issuer, subject=subject)
            )
    user = identity.user
    user.email = str(claims.get("email") or "")[:254]
    user.first_name = str(claims.get("given_name") or "")[:150]
    user.last_name = str(claims.get("family_name") or "")[:150]
    user.save()
    identity.claim_values = values
    identity.last_sign_in_at = now
    identity.save()
    changes = sso_memberships_sync(user=user, grants=sso.workspace_grants(values, mapping))
    if changes:
        sso_memberships_changed.send(sender=SsoIdentity, user=user, changes=changes, claim_values=values)
    return user


def sso_memberships_sync(*, user: AbstractBaseUser, grants: Mapping[str, Role]) -> list[MembershipChange]:
    """Make the memberships the mapping granted `user` exactly `grants` (workspace slug → role); leave
    the ones set by hand alone. Returns what changed. Runs in the caller's transaction."""
    changes: list[MembershipChange] = []
    held = {
        m.workspace_id: m for m in Membership.objects.select_for_update().filter(user=user).select_related("workspace")
    }
    workspaces = {w.slug: w for w in Workspace.objects.filter(slug__in=grants)}
    for slug in sorted(set(grants) - set(workspaces)):
        logger.warning("OIDC_WORKSPACE_MAP names workspace %r, which does not exist: skipped for %s", slug, user)
    for slug, workspace in sorted(workspaces.items()):
        role, current = grants[slug], held.get(workspace.pk)
        if current is not None and (not current.granted_by_sso or current.role == role):
            continue
        membership = membership_set(workspace=workspace, user=user, role=role, granted_by_sso=True)
        changes.append(MembershipChange(workspace, membership.pk, current.role if current else None, str(role)))
    granted_ids = {w.pk for w in workspaces.values()}
    for membership in held.values():
        if membership.granted_by_sso and membership.workspace_id not in granted_ids:
            membership_remove(workspace=membership.workspace, user=user)
            changes.append(MembershipChange(membership.workspace, membership.pk, membership.role, None))
    return changes


def _free_username(base: str) -> str:
    """`base`, or `base-2`, `base-3`, ... : the first that no user has (a local account keeps its name)."""
    users = get_user_model().objects
    name, n = base, 1
    while users.filter(username__iexact=name).exists():
        n += 1
        name = f"{base}-{n}"
    return name


def _clean_limit(name: str, value: Any) -> float | None:
    """A limit as stored: None (unlimited), a whole number for counts, a number for cores and GiB."""
    if value is None or value == "":
        return None
    quota = BY_NAME[name]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError({name: "A number, or empty for unlimited."})
    if quota.whole and not float(value).is_integer():
        raise ValidationError({name: "A whole number, or empty for unlimited."})
    if not 0 <= value <= MAX_LIMIT:
        raise ValidationError({name: f"From 0 to {MAX_LIMIT}, or empty for unlimited."})
    return int(value) if quota.whole else float(value)


@transaction.atomic
def workspace_quota_set(
    *, actor: AbstractBaseUser, workspace: Workspace, limits: Mapping[str, Any], staff: bool = False
) -> WorkspaceQuota:
    """Set some of the workspace's quota limits (name → number, None for unlimited); the others stay.

    Only the workspace's Owner may, or staff through the admin (`staff=True`); 403 otherwise, 400 with
    field messages for an unknown quota or a bad number. A limit below what is in use refuses new work
    and stops nothing. Every change is sent as `quota_changed` (the audit trail records it).
    """
    if not (staff or is_owner(actor, workspace)):
        raise PermissionDenied("Only the workspace's Owner can change its quotas.")
    unknown = sorted(set(limits) - set(BY_NAME))
    if unknown:
        raise ValidationError({name: "No such quota." for name in unknown})
    clean = {name: _clean_limit(name, value) for name, value in limits.items()}
    row = locked_quota(workspace.pk)  # in turn with admissions: the new limit applies to the next one
    changes = {name: [getattr(row, name), value] for name, value in clean.items() if getattr(row, name) != value}
    for name, (_, value) in changes.items():
        setattr(row, name, value)
    if changes:
        row.save(update_fields=[*changes, "updated_at"])
        quota_changed.send(sender=WorkspaceQuota, workspace=workspace, actor=actor, changes=changes)
    return row

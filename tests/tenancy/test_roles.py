"""Roles map to guardian object permissions and follow role changes and removal."""

from __future__ import annotations

import pytest

from tenancy import services
from tenancy.models import Membership, Role
from tenancy.permissions import can_edit, can_operate, can_view

pytestmark = pytest.mark.django_db


def _role(user, workspace) -> str | None:
    return Membership.objects.filter(user=user, workspace=workspace).values_list("role", flat=True).first()


@pytest.mark.parametrize(
    ("role", "view", "edit", "operate"),
    [
        ("owner", True, True, True),
        ("admin", True, True, True),
        ("member", True, True, False),
        ("viewer", True, False, False),
    ],
)
def test_role_grants(workspace, member_of, role, view, edit, operate):
    user = member_of(workspace, role)
    assert (can_view(user, workspace), can_edit(user, workspace), can_operate(user, workspace)) == (
        view,
        edit,
        operate,
    )


def test_non_member_has_no_rights(workspace, other_workspace, member_of):
    outsider = member_of(other_workspace, "owner")
    assert not can_view(outsider, workspace)
    assert not can_operate(outsider, workspace)
    assert _role(outsider, workspace) is None


def test_demotion_revokes_operate_permission(workspace, member_of, django_user_model):
    user = member_of(workspace, "admin")
    assert can_operate(user, workspace)
    services.membership_set(workspace=workspace, user=user, role=Role.VIEWER)
    user = django_user_model.objects.get(pk=user.pk)  # fresh permission cache
    assert not can_operate(user, workspace)
    assert not can_edit(user, workspace)
    assert can_view(user, workspace)
    assert _role(user, workspace) == Role.VIEWER


def test_removal_revokes_everything(workspace, member_of, django_user_model):
    user = member_of(workspace, "owner")
    services.membership_remove(workspace=workspace, user=user)
    user = django_user_model.objects.get(pk=user.pk)
    assert not can_view(user, workspace)


def test_workspace_create_makes_creator_owner(owner, workspace):
    assert _role(owner, workspace) == Role.OWNER
    assert workspace.slug == "acme"


def test_unknown_role_is_rejected(workspace, owner):
    with pytest.raises(ValueError, match="superuser"):
        services.membership_set(workspace=workspace, user=owner, role="superuser")

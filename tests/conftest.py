"""Shared fixtures: users in workspaces with each role, API clients signed in as them."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from cleverthis.tenancy import services as tenancy_services
from cleverthis.tenancy.models import Role, Workspace

User = get_user_model()


@pytest.fixture
def make_user(db: None) -> Callable[..., object]:
    """Factory for users with a known password."""

    def make(username: str, **extra: object) -> object:
        return User.objects.create_user(username=username, password="pw-" + username, **extra)

    return make


@pytest.fixture
def owner(make_user: Callable[..., object]) -> object:
    return make_user("owner")


@pytest.fixture
def workspace(owner: object) -> Workspace:
    return tenancy_services.workspace_create(name="Acme", owner=owner)


@pytest.fixture
def other_workspace(make_user: Callable[..., object]) -> Workspace:
    """A workspace none of the `workspace` members belong to."""
    return tenancy_services.workspace_create(name="Globex", owner=make_user("globex-owner"))


@pytest.fixture
def member_of(make_user: Callable[..., object]) -> Callable[[Workspace, str], object]:
    """Factory: a new user holding `role` in `workspace`."""

    def make(workspace: Workspace, role: str) -> object:
        user = make_user(f"{role}-{workspace.slug}")
        tenancy_services.membership_set(workspace=workspace, user=user, role=Role(role))
        return user

    return make


@pytest.fixture
def api_client_for() -> Callable[[object], APIClient]:
    """Factory: an APIClient authenticated as `user`."""

    def make(user: object) -> APIClient:
        client = APIClient()
        client.force_authenticate(user=user)
        return client

    return make

"""Create the demo admin user and workspace used by the one-command local start."""

from __future__ import annotations

import os
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from tenancy import services
from tenancy.models import Role, Workspace


class Command(BaseCommand):
    """Idempotent: re-running keeps the existing user and workspace."""

    help = "Create an admin user (DEMO_ADMIN_USER/DEMO_ADMIN_PASSWORD, default admin/admin) and a Demo workspace."

    def handle(self, *args: Any, **options: Any) -> None:
        username = os.environ.get("DEMO_ADMIN_USER", "admin")
        password = os.environ.get("DEMO_ADMIN_PASSWORD", "admin")
        User = get_user_model()
        user, created = User.objects.get_or_create(
            username=username, defaults={"is_staff": True, "is_superuser": True, "email": f"{username}@localhost"}
        )
        if created:
            user.set_password(password)
            user.save(update_fields=["password"])
        workspace = Workspace.objects.filter(slug="demo").first()
        if workspace is None:
            workspace = services.workspace_create(name="Demo", slug="demo", owner=user)
        else:
            services.membership_set(workspace=workspace, user=user, role=Role.OWNER)
        state = "created" if created else "kept"
        self.stdout.write(f"demo user {username!r} {state}; workspace {workspace.name!r} ready")

"""App config for tenancy."""

from django.apps import AppConfig


class TenancyConfig(AppConfig):
    """Workspaces and roles."""

    name = "tenancy"
    label = "tenancy"
    verbose_name = "Tenancy"
    default_auto_field = "django.db.models.BigAutoField"

"""App config for managed Ray."""

from django.apps import AppConfig


class RaymgrConfig(AppConfig):
    """Managed Ray clusters on compute clusters."""

    name = "raymgr"
    verbose_name = "Ray"
    default_auto_field = "django.db.models.BigAutoField"

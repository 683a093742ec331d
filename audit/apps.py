"""App config for the audit trail."""

from django.apps import AppConfig


class AuditConfig(AppConfig):
    """Operator actions, written by the services that perform them."""

    name = "audit"
    label = "audit"
    verbose_name = "Audit trail"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from audit import receivers

        receivers.connect()

"""App config for the compute fleet."""

from django.apps import AppConfig


class FleetConfig(AppConfig):
    """Compute clusters and their nodes."""

    name = "fleet"
    verbose_name = "Compute fleet"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from fleet import agent_updates, signals
        from fleet.workloads import receivers

        receivers.connect()
        signals.command_finished.connect(agent_updates.record_outcome, dispatch_uid="fleet.agent_updates.outcome")

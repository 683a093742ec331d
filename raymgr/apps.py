"""App config for managed Ray."""

from django.apps import AppConfig


class RaymgrConfig(AppConfig):
    """Managed Ray clusters on compute clusters."""

    name = "raymgr"
    verbose_name = "Ray"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from fleet.signals import command_finished
        from raymgr import payloads

        payloads.register()
        command_finished.connect(_on_command_finished, dispatch_uid="raymgr.ray_on_command_finished")


def _on_command_finished(sender: object, command: object, **kwargs: object) -> None:
    """Adapter from the signal's (sender, **kwargs) to the keyword-only service."""
    from raymgr import services

    services.ray_on_command_finished(command=command)

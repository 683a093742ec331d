"""App config for managed Ray."""

from django.apps import AppConfig


class RaymgrConfig(AppConfig):
    """Managed Ray clusters on compute clusters."""

    name = "raymgr"
    verbose_name = "Ray"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from fleet.signals import command_finished
        from raymgr import endpoint_groups, payloads, quotas

        payloads.register()
        endpoint_groups.register()  # distributed endpoints run on managed Ray clusters
        quotas.register()  # what Ray clusters and Ray nodes count against workspace quotas
        command_finished.connect(_on_command_finished, dispatch_uid="raymgr.ray_on_command_finished")
        from raymgr.workloads import wiring

        wiring.connect()


def _on_command_finished(sender: object, command: object, **kwargs: object) -> None:
    """Adapter from the signal's (sender, **kwargs) to the keyword-only service.

    Never lets a Ray failure break the recording of the command result itself (the service runs in its
    own savepoint; the error is logged).
    """
    import logging

    from raymgr import services

    try:
        services.ray_on_command_finished(command=command)
    except Exception:
        logging.getLogger("raymgr").exception("Ray follow-up of command %s failed", getattr(command, "pk", "?"))

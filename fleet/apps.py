"""App config for the compute fleet."""

from django.apps import AppConfig


class FleetConfig(AppConfig):
    """Compute clusters and their nodes."""

    name = "fleet"
    verbose_name = "Compute fleet"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from agent import asyncio_fixes
        from fleet import agent_updates, browser_push, signals
        from fleet.proxy import site_checks  # registers its system check
        from fleet.usage import admin as usage_admin  # noqa: F401  (registers the usage rollups' ModelAdmin)
        from fleet.workloads import admin as workload_admin  # noqa: F401  (registers the workload ModelAdmins)
        from fleet.workloads import receivers
        from tenancy.signals import membership_removed

        # Every cancellation reaches its task: Python 3.11's wait_for (used by redis-py for each command)
        # could lose one, and a tunnel consumer or the tunnel inbox reader then never ended.
        asyncio_fixes.install()
        receivers.connect()
        signals.command_finished.connect(agent_updates.record_outcome, dispatch_uid="fleet.agent_updates.outcome")
        membership_removed.connect(browser_push.member_removed, dispatch_uid="fleet.browser_push.member_removed")
        # node origins sharing a site with the control plane or each other: said at every start-up
        site_checks.log_origin_domain_warnings()

"""Tell every connected agent to disconnect and stay away for a while (before a deploy or restart)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from fleet import groups


class Command(BaseCommand):
    """Broadcast `agents.backoff` to all tunnels on every replica."""

    help = "Ask all agents to back off for --seconds (they reconnect afterwards with jitter)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--seconds", type=float, default=30.0)
        parser.add_argument("--reason", default="control plane deploy")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["seconds"] <= 0:
            raise ValueError("--seconds must be positive")
        groups.ask_all_agents_to_back_off(options["seconds"], options["reason"])
        self.stdout.write(f"asked agents to back off for {options['seconds']:.0f}s")

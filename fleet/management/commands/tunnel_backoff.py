"""Tell every connected agent to disconnect and stay away for a while (before a deploy or restart)."""

from __future__ import annotations

from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.core.management.base import BaseCommand, CommandParser

from fleet.consumers import AGENTS_GROUP


class Command(BaseCommand):
    """Broadcast `agents.backoff` to all tunnels on every replica."""

    help = "Ask all agents to back off for --seconds (they reconnect afterwards with jitter)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--seconds", type=float, default=30.0)
        parser.add_argument("--reason", default="control plane deploy")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["seconds"] <= 0:
            raise ValueError("--seconds must be positive")
        async_to_sync(get_channel_layer().group_send)(
            AGENTS_GROUP, {"type": "agents.backoff", "retry_after_s": options["seconds"], "reason": options["reason"]}
        )
        self.stdout.write(f"asked agents to back off for {options['seconds']:.0f}s")

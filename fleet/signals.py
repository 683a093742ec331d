"""Signals the fleet sends for other apps (raymgr) to react to."""

from __future__ import annotations

import django.dispatch

# Sent with `command=<fleet.models.Command>` once a command has reached succeeded or failed.
command_finished = django.dispatch.Signal()

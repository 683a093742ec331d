"""Signals the fleet core sends; workloads (`fleet.workloads.receivers`) and other apps (raymgr) listen.

The core services send these instead of importing what builds on them, so no import circle forms.
"""

from __future__ import annotations

import django.dispatch

# Sent with `node=`, `inventory=<agent.protocol.Inventory>` inside the transaction that stores a node's
# inventory (hello or inventory frame). A receiver's failure fails that write.
inventory_received = django.dispatch.Signal()

# Sent with `command=<fleet.models.Command>` after an ack is recorded. Receivers open their own
# savepoint and log their failures: the recorded ack must never be lost.
command_acked = django.dispatch.Signal()

# Sent with `command=<fleet.models.Command>` once a command has reached succeeded or failed. Receivers
# open their own savepoint and log their failures, as for `command_acked`.
command_finished = django.dispatch.Signal()

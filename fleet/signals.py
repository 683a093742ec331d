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

# Sent with `command_ids=<list of Command primary keys>` inside the transaction that records agents'
# reports on those commands, before it locks their nodes and the commands themselves: a
# receiver locks here, in the fleet's lock order (docs/architecture.md), the rows its `command_acked` and
# `command_finished` receivers will lock (the endpoints of endpoint.start / endpoint.stop), so that those
# rows are never taken after the nodes and commands a concurrent service locks after them.
command_reports_locking = django.dispatch.Signal()

# Sent with `commands=<list of fleet.models.Command>` (one batch, all of one type) inside the transaction
# that queues them, before the dispatch task is enqueued. A receiver may refuse the batch by raising
# Django's ValidationError (nothing is then written; the caller gets HTTP 400).
commands_queued = django.dispatch.Signal()

# Sent with `node=<fleet.models.Node>` by `node_drain` when the node it put in draining still runs containers.
# The workloads (`fleet.workloads.receivers`) enqueue a drain pass for it after commit.
drain_requested = django.dispatch.Signal()

# Sent with `node=<fleet.models.Node>` and `reachable=<bool>` by `node_purge` inside the deleting transaction,
# before the node's rows go. `reachable` says whether its agent holds a tunnel now (it is then told to stop
# what it started, and exits). Receivers record what becomes of the workloads that ran there.
node_deleting = django.dispatch.Signal()

"""Signals tenancy sends for the apps above it (it imports none of them)."""

from __future__ import annotations

import django.dispatch

# Sent inside `workspace_quota_set`'s transaction with `workspace`, `actor` and `changes`
# ({quota name: [old limit, new limit]}, only the limits that changed); the audit trail records it.
quota_changed = django.dispatch.Signal()

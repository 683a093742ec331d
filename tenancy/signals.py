"""Signals of the tenancy app, for the apps above it (it imports none of them)."""

from __future__ import annotations

from django.dispatch import Signal

# Sent inside the single sign-on transaction when the claim mapping changed a user's memberships.
# Arguments: `user`, `changes` (a list of `services.MembershipChange`), `claim_values` (the mapped claim's
# values). The audit trail records one entry per change in that same transaction.
sso_memberships_changed = Signal()

# Sent inside `workspace_quota_set`'s transaction with `workspace`, `actor` and `changes`
# ({quota name: [old limit, new limit]}, only the limits that changed); the audit trail records it.
quota_changed = Signal()

# Sent inside `membership_remove`'s transaction with `workspace` and `user` once the membership is gone:
# whatever the member still holds open for that workspace (a browser's live socket) lets it go.
membership_removed = Signal()

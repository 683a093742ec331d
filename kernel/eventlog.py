"""The shape every event log in the product shares (node, cluster and Ray cluster events)."""

from __future__ import annotations

import uuid

from django.db import models


class EventLogEntry(models.Model):
    """One line of an event log: a machine-readable kind, a human message and structured data."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    kind = models.CharField(max_length=40)
    message = models.TextField()
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        abstract = True
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"

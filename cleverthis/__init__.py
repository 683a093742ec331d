"""CleverThis Compute Fleet control plane project."""

from cleverthis.celery import app as celery_app

__all__ = ["celery_app"]

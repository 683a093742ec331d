"""Managed Ray clusters, training jobs, Serve deployments and Tune experiments."""

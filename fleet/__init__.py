"""Compute fleet: clusters, nodes, join tokens, certificates and commands."""

"""Workspaces, memberships and roles: the tenancy boundary of every object."""

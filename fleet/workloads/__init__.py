"""Workloads on nodes: containers, models cached on nodes, inference endpoints, and drains.

Here: their models (`models`, registered with the `fleet` app through `fleet.models`), writes
(`services`), reads (`selectors`), error explanations (`errors`), the API (`api`),
Celery tasks (`tasks`), drains that move containers off a node (`drain`), and the receivers that follow
the fleet core's signals (`receivers`).

Not here: clusters, nodes, join tokens, commands and namespaces (the core, at the top of `fleet/`), which never
import this package: they send `fleet.signals` and enqueue tasks through `fleet.enqueue`.
"""

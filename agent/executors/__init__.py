"""Executors turn commands into real work for one orchestration mode (docker, kubernetes, argocd)."""

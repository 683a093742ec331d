"""Tests of `agent.workloads`."""

"""Tests of `agent.transport`."""

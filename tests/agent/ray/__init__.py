"""Tests of `agent.ray`."""

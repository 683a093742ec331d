"""Tests of `fleet.workloads`."""

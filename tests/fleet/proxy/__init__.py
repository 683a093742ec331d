"""Tests of `fleet.proxy`."""

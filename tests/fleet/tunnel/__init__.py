"""Tests of `fleet.tunnel`."""

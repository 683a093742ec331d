"""Host facts and utilization come from the real machine; no GPU here is a normal report."""

from __future__ import annotations

import socket

import psutil

from agent import inventory
from agent.protocol import decode, encode


def test_host_facts_describe_this_machine():
    facts = inventory.host_facts()
    assert facts.hostname == socket.gethostname()
    assert facts.cpu_count == psutil.cpu_count()
    assert facts.memory_total_mb > 0
    assert facts.arch


def test_no_nvidia_driver_means_no_gpu_not_an_error():
    # This machine has no NVIDIA library: nvmlInit raises NVMLError_LibraryNotFound.
    assert inventory.detect_gpus() == []


def test_heartbeat_reports_utilization_and_round_trips():
    beat = inventory.heartbeat(containers_running=3)
    assert 0.0 <= beat.cpu_percent <= 100.0
    assert 0.0 < beat.memory_percent <= 100.0
    assert beat.memory_total_mb >= beat.memory_used_mb > 0
    assert beat.containers_running == 3
    assert decode(encode(beat)) == beat

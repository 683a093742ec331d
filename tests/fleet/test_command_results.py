"""The Result column's few words for a command's result (`fleet.command_results`)."""

from __future__ import annotations

from fleet.command_results import result_summary


def test_a_download_reads_as_model_size_and_files():
    result = {"model_id": "acme/tiny", "revision": "v2", "commit": "c0", "path": "/m", "size_bytes": 4096, "files": 2}
    assert result_summary(result) == "acme/tiny@v2 · 4.0\xa0KB · 2 files"


def test_a_container_reads_as_name_state_and_short_id():
    result = {"container_id": "3f2a9c1d5e6b7a8c9d0e", "name": "web", "status": "running", "existed": False}
    assert result_summary(result) == "web · running · id 3f2a9c1d5e6b"


def test_logs_paths_and_pids_are_left_out_and_lists_are_counted():
    assert result_summary({"endpoint_id": "ab12", "port": 8001, "pid": 7, "device": "cpu", "log_tail": "x" * 99}) == (
        "endpoint ab12 · port 8001 · cpu"
    )
    assert result_summary({"nodes": [{}, {}, {}], "pending": [], "truncated": False}) == "3 nodes"


def test_at_most_four_short_phrases_and_nothing_for_no_result():
    result = {"name": "n" * 100, "status": "RUNNING", "stopped": True, "reason": "r", "port": 1}
    summary = result_summary(result)
    assert summary == "n" * 59 + "… · running · stopped · r"
    assert result_summary({}) == ""
    assert result_summary(None) == ""

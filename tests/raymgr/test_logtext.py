"""Logs as pages show them: no terminal escape codes, no CTFLEET marker lines (`raymgr.logtext`)."""

from __future__ import annotations

from raymgr.logtext import console_text, strip_ansi

TUNE_LOG = (
    "\x1b[2m\x1b[36m(pid=412)\x1b[0m Trial t_00000 started\n"
    '\x1b[36m(Trainable pid=2, ip=10.0.0.1)\x1b[0m CTFLEET {"kind": "trial", "trial_id": "t_00000"}\n'
    'CTFLEET {"kind": "best", "config": {"x": 1}}\n'
    "\x1b[1m\x1b[32m== Status ==\x1b[0m\r\n"
    "Current time: 2024-01-01 \x1b]8;;http://x\x07link\x1b]8;;\x07 done\n"
    "a line that mentions CTFLEET in passing stays\n"
)


def test_escape_codes_and_marker_lines_are_removed_and_the_rest_kept():
    text = console_text(TUNE_LOG)
    assert "\x1b" not in text
    assert "CTFLEET {" not in text
    assert text.split("\n") == [
        "(pid=412) Trial t_00000 started",
        "== Status ==",
        "Current time: 2024-01-01 link done",
        "a line that mentions CTFLEET in passing stays",
        "",
    ]


def test_nothing_and_plain_text():
    assert console_text(None) == ""
    assert console_text("") == ""
    assert console_text("plain\n\nlines") == "plain\n\nlines"
    assert strip_ansi("\x1b[31mred\x1b[0m \x1b[2Kcleared") == "red cleared"

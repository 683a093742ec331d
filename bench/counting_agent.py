"""`python -m agent run` that also counts the tunnel's WebSocket messages and stream frames (for benchmarks).

    cd TREE && PYTHONPATH=TREE python bench/counting_agent.py COUNTS.json run --state-dir STATE

Runs the agent of the working directory's tree (this one, or an older checkout for a before/after
comparison) unchanged, with `agent.protocol.decode` and `FrameSender.next_message` wrapped to count what
it receives (messages, and the stream frames they carry: a `StreamBatch` or `StreamFrames` counts each
entry) and what it sends (messages). The counts are written to COUNTS.json five times a second.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

STREAM_TYPES = ("stream_open", "stream_data", "stream_window", "stream_end", "stream_batch", "stream_frames")


def install_counters(counts: dict[str, int]) -> None:
    """Wrap the agent's decoder (every received message passes it) and its sender's message picker."""
    from agent import protocol
    from agent.transport import tunnel

    decode = protocol.decode
    next_message = tunnel.FrameSender.next_message

    def counting_decode(raw: Any) -> Any:
        frame = decode(raw)
        if frame.TYPE in STREAM_TYPES:
            counts["received_stream_messages"] += 1
            entries = getattr(frame, "frames", None) or getattr(frame, "chunks", None) or [frame]
            counts["received_stream_frames"] += len(entries)
            counts["received_opens"] += sum(1 for entry in entries if getattr(entry, "TYPE", "") == "stream_open")
        return frame

    def counting_next_message(self: Any) -> Any:
        message = next_message(self)
        if message is not None:
            counts["sent_messages"] += 1
        return message

    protocol.decode = counting_decode
    tunnel.FrameSender.next_message = counting_next_message


def write_counts(path: Path, counts: dict[str, int]) -> None:
    """Write `counts` to `path` every 0.2 s (a daemon thread: it ends with the agent)."""
    while True:
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(counts))
        os.replace(temporary, path)
        time.sleep(0.2)


def main() -> int:
    counts_path = Path(sys.argv[1])
    tree = os.getcwd()
    sys.path[0] = tree  # the agent of the working directory's tree, as `python -m agent` would find it
    counts = {"received_stream_messages": 0, "received_stream_frames": 0, "received_opens": 0, "sent_messages": 0}
    install_counters(counts)
    threading.Thread(target=write_counts, args=(counts_path, counts), daemon=True).start()
    from agent.__main__ import main as agent_main

    return agent_main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())

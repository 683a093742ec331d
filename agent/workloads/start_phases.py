"""The phases of one endpoint server's start, timed on the node (`agent.protocol.StartPhases`).

A `PhaseClock` starts when the agent takes the endpoint.start command; the manager marks each phase's end
as it passes it: weights present or downloaded, server process spawned, model loaded (the first line of the
server's log saying its weights are loaded, `MODEL_LOADED_LINES`, read while waiting for it to answer; a server
that never logs one counts as loaded when it answers), first health check passed, adapters loaded.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

from agent.protocol import StartPhases

# What vLLM logs once the model's weights are in memory (the GPU runner, and the loader every build uses).
MODEL_LOADED_LINES = re.compile(rb"Model loading took|Loading weights took")


class PhaseClock:
    """Seconds since the start was taken, per phase; `log_path` is read for the model-loaded line."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.weights = ""
        self.weights_bytes = 0
        self.marks: dict[str, float] = {}
        self._log_path: Path | None = None
        self._log_offset = 0

    def now(self) -> float:
        """Seconds since the start was taken (3 decimals)."""
        return round(time.monotonic() - self.started, 3)

    def mark(self, phase: str) -> float:
        """Record that `phase` ended now (a phase marked already keeps its first time)."""
        return self.marks.setdefault(phase, self.now())

    def weights_done(self, how: str, size: int) -> None:
        """The weights are on the node: `how` is present (cached) or downloaded, `size` their bytes."""
        self.weights, self.weights_bytes = how, size
        self.mark("weights")

    def watch_log(self, path: Path) -> None:
        """Read the server's log at `path` for the model-loaded line from now on (`poll_log`)."""
        self._log_path, self._log_offset = path, 0

    def poll_log(self) -> None:
        """Mark `model_loaded` when the server's log has said so since the last look."""
        if self._log_path is None or "model_loaded" in self.marks:
            return
        start = max(0, self._log_offset - 64)  # a line may straddle two looks
        try:
            with self._log_path.open("rb") as log:
                log.seek(start)
                chunk = log.read()
        except OSError:
            return
        self._log_offset = start + len(chunk)
        if MODEL_LOADED_LINES.search(chunk):
            self.mark("model_loaded")

    def result(self) -> StartPhases:
        """The phases as the start's typed result reports them."""
        healthy = self.marks.get("healthy", self.now())
        return StartPhases(
            weights=self.weights,
            weights_bytes=self.weights_bytes,
            weights_s=self.marks.get("weights", 0.0),
            server_started_s=self.marks.get("server_started", 0.0),
            model_loaded_s=self.marks.get("model_loaded", healthy),
            healthy_s=healthy,
            adapters_s=self.marks.get("adapters"),
        )

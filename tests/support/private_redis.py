"""A redis-server of a test's own, on a free port, that the test may kill and start again.

The shared Redis on 6379 is never touched: a test that restarts "Redis" points the processes it starts at
this one (their TEST_REDIS_URL). Each start writes its own log (redis-1.log, redis-2.log, ...) under the
test's directory; `stop()` ends the server's whole process group.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.support.processes import ManagedProcess, free_port, port_open, wait_until


class PrivateRedis:
    """A redis-server of this test's own on a free port (the shared one on 6379 is never touched)."""

    def __init__(self, log_dir: Path) -> None:
        self.port = free_port()
        self.log_dir = log_dir
        self.proc: ManagedProcess | None = None
        self.starts = 0

    def start(self) -> None:
        argv = [
            shutil.which("redis-server") or "redis-server",
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ]
        self.starts += 1
        self.proc = ManagedProcess(f"redis-{self.starts}", argv, log_dir=self.log_dir)
        wait_until(lambda: port_open(self.port), timeout=10, what="private redis")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.popen.wait(10)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

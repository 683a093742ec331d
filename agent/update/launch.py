"""Start the agent version `current` names, and restart into it after an update.

`python -m agent run` first calls `exec_current`: when `versions/current` names a version other than
the code running, the process re-executes itself (`os.execv`, same pid) with that version's directory
as working directory, which `python -m` puts first on sys.path. A version on trial that is past its
deadline without having connected (it crashed before it could even roll itself back) is rolled back
here first. After an update the agent exits with `EXIT_RESTART`: under systemd (INVOCATION_ID is set)
the unit's Restart=always starts it again; otherwise `restart` re-executes at once.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from agent.config import AgentConfig
from agent.update import updater
from agent.update.store import now

log = logging.getLogger("agent.update")
EXIT_RESTART = 75  # "restart me": the agent switched versions (systemd restarts any exit but 3)
RUNNING_DIR = "CLEVERTHIS_AGENT_DIR"  # the version directory this process was started from ("" = base)
BASE_CWD = "CLEVERTHIS_AGENT_BASE_CWD"
BASE_PYTHONPATH = "CLEVERTHIS_AGENT_BASE_PYTHONPATH"


def under_systemd() -> bool:
    return bool(os.environ.get("INVOCATION_ID"))


def exec_current(config: AgentConfig) -> None:
    """Re-execute into the version `current` names, unless this process already runs it."""
    marker = updater.store_for(config).marker()
    if marker is not None and marker.state == "trial" and now() > marker.deadline + 5:
        updater.rollback(config, marker, "did not connect before its deadline")
    target = updater.store_for(config).current_dir()
    running = os.environ.get(RUNNING_DIR, "")
    if str(target or "") != running:
        _exec(target)


def restart(config: AgentConfig) -> None:
    """After an update: re-execute into the version `current` names (never returns)."""
    _exec(updater.store_for(config).current_dir())


def _exec(target: Path | None) -> None:
    os.environ.setdefault(BASE_CWD, os.getcwd())
    os.environ.setdefault(BASE_PYTHONPATH, os.environ.get("PYTHONPATH", ""))
    base_path = os.environ[BASE_PYTHONPATH]
    if target is None:
        os.chdir(os.environ[BASE_CWD])
        os.environ["PYTHONPATH"] = base_path
    else:
        os.chdir(target)
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(target), base_path]))
    os.environ[RUNNING_DIR] = str(target or "")
    log.info("starting agent from %s", target or "its installed code")
    for handler in logging.getLogger().handlers:
        handler.flush()
    os.execv(sys.executable, [sys.executable, "-m", "agent", *sys.argv[1:]])

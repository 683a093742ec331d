"""Run inside a Ray node's container: start, watch and end one endpoint rank there, answering one JSON line.

`agent.workloads.container_rank` runs ``python -c <this file's source> <action> <json>`` through the
container engine's exec, with the container's own python (the image's, which carries vLLM): nothing of the
agent needs installing in the image. The rank runs as ``sh -c '"$@"; echo $? >exit_file'`` in a session of
its own (its pid is the session id), with its output in a log file inside the container, so it lives and
dies with the container and every process of it is found by its session.

Standard library only; no ``from __future__`` import (the file runs as a ``-c`` program). Actions:

- ``start {"argv", "env", "mark", "log", "exit_file", "files", "need", "modules"}``: refuse when a path in `need` is
  missing or a module in `modules` cannot be imported; write `files` (path → text); start the rank;
  answer ``{"pid"}``.
- ``poll {"pid", "token", "log", "exit_file", "offset", "max"}``: whether the rank lives (its pid not a
  zombie and its command line naming `token`), its exit status once written, and its log from `offset`.
- ``stop {"pid", "mark", "timeout_s"}``: SIGTERM and SIGCONT to every process of the rank (its session, and
  any process carrying its mark ``CLEVERTHIS_RANK=<mark>`` in its environment: one that left the session),
  SIGKILL to what is left after `timeout_s`; answers ``{"left"}`` (processes still there, zombies aside).
"""

import base64
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

MARKER = "RANKJSON"
MARK_ENV = "CLEVERTHIS_RANK"  # in every rank process's environment: its name
# The rank's program, then its exit status written where the agent looks (`poll`).
WRAPPER = '"$@"; echo $? >"$RANK_EXIT_FILE"'


def _stat(pid):
    """(state, session id) of process `pid` from /proc; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as found:
            fields = found.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[3])


def _living(pid):
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z"


def _marked(pid, mark):
    try:
        with open(f"/proc/{pid}/environ", "rb") as found:
            return f"{MARK_ENV}={mark}".encode() in found.read().split(b"\0")
    except OSError:
        return False


def _members(sid, mark):
    """The living processes of the rank: of session `sid`, or carrying `mark` (zombies are past signals)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            stat = _stat(int(name))
            if stat is None or stat[0] == "Z":
                continue
            if stat[1] == sid or (mark and _marked(int(name), mark)):
                found.append(int(name))
    return found


def start(spec):
    for path in spec.get("need", []):
        if not os.path.exists(path):
            return {"error": "missing", "path": path}
    for module in spec.get("modules", []):
        if importlib.util.find_spec(module) is None:
            return {"error": "no_module", "module": module}
    for path, text in spec.get("files", {}).items():
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as out:
            out.write(text)
    os.makedirs(os.path.dirname(spec["log"]), exist_ok=True)
    if os.path.exists(spec["exit_file"]):  # a former run's status
        os.unlink(spec["exit_file"])
    env = {**os.environ, **spec.get("env", {}), "RANK_EXIT_FILE": spec["exit_file"], MARK_ENV: spec["mark"]}
    with open(spec["log"], "wb") as log:
        child = subprocess.Popen(
            ["sh", "-c", WRAPPER, "rank", *spec["argv"]],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    return {"pid": child.pid}


def poll(spec):
    pid, token = spec["pid"], str(spec.get("token", ""))
    alive = _living(pid)
    if alive and token:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as found:
                alive = token.encode() in found.read().split(b"\0")
        except OSError:
            alive = False
    code = None
    try:
        with open(spec["exit_file"]) as found:
            code = int(found.read().strip() or "-1")
    except (OSError, ValueError):
        pass
    data, offset = b"", spec.get("offset", 0)
    if spec.get("log"):
        try:
            with open(spec["log"], "rb") as log:
                log.seek(offset)
                data = log.read(spec.get("max", 65536))
        except OSError:
            data = b""
    return {
        "alive": alive and code is None,
        "exit": code,
        "data": base64.b64encode(data).decode(),
        "offset": offset + len(data),
    }


def stop(spec):
    sid, mark, timeout_s = spec["pid"], spec.get("mark", ""), float(spec.get("timeout_s", 15))
    for sig in (signal.SIGTERM, signal.SIGCONT):
        for pid in _members(sid, mark):
            try:
                os.kill(pid, sig)
            except OSError:
                pass
    deadline = time.monotonic() + timeout_s
    while _members(sid, mark) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in _members(sid, mark):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    time.sleep(0.1)
    return {"left": len(_members(sid, mark))}


ACTIONS = {"start": start, "poll": poll, "stop": stop}

if __name__ == "__main__":
    print(MARKER + json.dumps(ACTIONS[sys.argv[1]](json.loads(sys.argv[2]))), flush=True)

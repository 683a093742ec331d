"""ctfleet: what a job's program needs from CleverThis Compute Fleet (shipped next to it in every Ray workload
job: training scripts, the fine-tune, Tune experiments, Serve deployments).

`SPEC` is the job's ``ctfleet_spec.json`` beside this file; `emit` prints the result markers the agent's
``ray.job.status`` reads back from the job's logs.
"""

import json
import os

SPEC_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ctfleet_spec.json")


def load_spec(path=SPEC_PATH):
    """The job's spec (``ctfleet_spec.json``, next to this file unless told)."""
    with open(path) as f:
        return json.load(f)


# (Read once, when a job imports this; a copy of the file without its spec beside it has none.)
SPEC = load_spec() if os.path.exists(SPEC_PATH) else {}


def emit(kind, **data):
    """Print one result marker the control plane reads back from the job's logs."""
    print("CTFLEET " + json.dumps(dict(kind=kind, **data), default=str), flush=True)


def config():
    """The job's hyperparameters (for jobs made from a Tune experiment: its best config)."""
    return dict(SPEC.get("config") or {})


def checkpoint_dir(name="checkpoint"):
    """A fresh directory for a checkpoint under the job's storage path."""
    root = os.path.expanduser(SPEC.get("storage_path") or "~/ctfleet-checkpoints")
    path = os.path.join(root, SPEC["job"], name)
    os.makedirs(path, exist_ok=True)
    return path


def report_checkpoint(path, **metrics):
    """Register `path` as a checkpoint of this job (selectable for serving)."""
    emit("checkpoint", path=str(path), metrics=metrics)


def report(**metrics):
    """Report progress metrics."""
    emit("metrics", metrics=metrics)

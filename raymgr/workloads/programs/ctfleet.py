"""ctfleet: what a training script needs from CleverThis Compute Fleet."""

import json
import os

_HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(_HERE, "ctfleet_spec.json")) as _f:
    SPEC = json.load(_f)


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

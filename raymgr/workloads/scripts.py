"""The Python programs Ray workload jobs run on the cluster, as the text shipped in each job's working dir.

The programs live in `raymgr.workloads.programs` (real modules: linted and tested) and are read here as
package data. Each reads ctfleet_spec.json and prints result markers, ``CTFLEET {json}`` lines, that the
agent's `ray.job.status` parses: ``{"kind": "checkpoint", "path": ..., "metrics": {...}}``,
``{"kind": "trial", ...}``, ``{"kind": "best", ...}``, ``{"kind": "deployed", ...}``. None of them imports
torch unless the built-in fine-tune actually runs.
"""

from __future__ import annotations

from importlib import resources

PROGRAMS = "raymgr.workloads.programs"


def program(filename: str) -> str:
    """The source of program `filename` (e.g. ``tune_run.py``)."""
    return resources.files(PROGRAMS).joinpath(filename).read_text(encoding="utf-8")


# Helper module shipped with every training job (as ctfleet.py): spec, config, checkpoint directories, markers.
HELPER = program("ctfleet.py")
# The built-in fine-tune (finetune.py): Ray Train TorchTrainer, optional LoRA.
FINETUNE = program("finetune.py")
# A Tune experiment (tune_run.py).
TUNE = program("tune_run.py")
# Deploying or deleting a Serve application (serve_deploy.py).
SERVE = program("serve_deploy.py")

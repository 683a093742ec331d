"""The programs workload jobs run on the cluster: shipped as their files, and their logic without a cluster."""

from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from agent.ray.jobs import parse_markers
from raymgr.workloads import scripts
from raymgr.workloads.programs import finetune, serve_deploy, tune_run

PROGRAMS = Path(scripts.__file__).parent / "programs"
SHIPPED = {"ctfleet.py": scripts.HELPER, "finetune.py": scripts.FINETUNE, "tune_run.py": scripts.TUNE}
SHIPPED["serve_deploy.py"] = scripts.SERVE


@pytest.mark.parametrize("filename", sorted(SHIPPED))
def test_each_job_ships_its_program_file_in_the_clusters_python(filename):
    source = SHIPPED[filename]
    assert source == (PROGRAMS / filename).read_text()
    ast.parse(source, filename, feature_version=(3, 8))  # the cluster's Python may be older than ours
    assert "from __future__" not in source


def load_ctfleet(tmp_path: Path, spec: dict) -> ModuleType:
    """ctfleet.py as a training job imports it: a copy next to the job's ctfleet_spec.json."""
    (tmp_path / "ctfleet.py").write_text(scripts.HELPER)
    (tmp_path / "ctfleet_spec.json").write_text(json.dumps(spec))
    found = importlib.util.spec_from_file_location("ctfleet", tmp_path / "ctfleet.py")
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    return module


def test_ctfleet_gives_config_checkpoint_dirs_and_markers_the_agent_reads(tmp_path, capsys):
    spec = {"job": "train-7", "config": {"lr": 0.1}, "storage_path": str(tmp_path / "store")}
    (tmp_path / "job").mkdir()
    ctfleet = load_ctfleet(tmp_path / "job", spec)
    config = ctfleet.config()
    config["lr"] = 5
    assert ctfleet.config() == {"lr": 0.1}
    path = ctfleet.checkpoint_dir("final")
    assert Path(path) == tmp_path / "store" / "train-7" / "final"
    assert Path(path).is_dir()
    ctfleet.report(epoch=1, loss=0.5)
    ctfleet.report_checkpoint(path, loss=0.25)
    assert parse_markers(capsys.readouterr().out) == [
        {"kind": "metrics", "metrics": {"epoch": 1, "loss": 0.5}},
        {"kind": "checkpoint", "path": path, "metrics": {"loss": 0.25}},
    ]


def test_finetune_shards_checkpoints_and_scales_as_the_spec_says(tmp_path):
    data = tmp_path / "texts.txt"
    data.write_text("one\n\n  two \nthree\nfour\n")
    texts = finetune.read_texts(str(data))
    assert texts == ["one", "two", "three", "four"]
    assert [finetune.shard(texts, rank, 2) for rank in (0, 1)] == [["one", "three"], ["two", "four"]]
    assert [e for e in range(1, 6) if finetune.checkpoint_due(e, 2, 5)] == [2, 4, 5]
    assert [e for e in range(1, 4) if finetune.checkpoint_due(e, 0, 3)] == [3]
    assert finetune.scaling_kwargs({"num_workers": 4, "cpus_per_worker": 2.0, "gpus_per_worker": 1.0}) == {
        "num_workers": 4,
        "use_gpu": True,
        "resources_per_worker": {"CPU": 2.0, "GPU": 1.0},
    }
    assert finetune.scaling_kwargs({"num_workers": 1, "cpus_per_worker": 1.0, "gpus_per_worker": 0})["use_gpu"] is False
    assert finetune.storage_path({"storage_path": str(tmp_path)}) == str(tmp_path)
    assert finetune.storage_path({"storage_path": ""}) == str(Path.home() / "ctfleet-checkpoints")


TUNE_SPEC = {"metric": "loss", "mode": "min", "max_iterations": 3, "objective_code": ""}


def test_tune_builtin_objective_is_best_at_three_and_reports_dicts():
    reported: list[dict] = []
    trainable = tune_run.make_trainable(tune_run.objective_for(TUNE_SPEC), reported.append)
    trainable({"x": 3, "name": "a"})
    assert reported == [{"loss": 1.0}, {"loss": 0.5}, {"loss": pytest.approx(1 / 3)}]
    reported.clear()
    tune_run.objective_for({**TUNE_SPEC, "mode": "max", "max_iterations": 1})({"x": 1}, reported.append)
    assert reported == [{"loss": -5.0}]


def test_tune_runs_the_users_objective_code():
    code = "def objective(config, report):\n    report({'score': config['a'] * 2})\n"
    reported: list[dict] = []
    tune_run.make_trainable(tune_run.objective_for({**TUNE_SPEC, "objective_code": code}), reported.append)({"a": 4})
    assert reported == [{"score": 8}]


def test_tune_keeps_only_numeric_results_and_reads_its_spec(tmp_path):
    assert tune_run.numeric({"loss": 0.5, "done": True, "iter": 2, "id": "t1"}) == {"loss": 0.5, "iter": 2}
    (tmp_path / "spec.json").write_text(json.dumps(TUNE_SPEC))
    assert tune_run.load_spec(str(tmp_path / "spec.json")) == TUNE_SPEC


def test_tune_domains_and_schedulers_with_the_local_ray():
    pytest.importorskip("ray.tune")
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, PopulationBasedTraining
    from ray.tune.search.sample import Categorical, Float, Integer

    assert tune_run.domain({"type": "grid", "values": [1, 2]}) == {"grid_search": [1, 2]}
    assert tune_run.domain({"type": "constant", "value": 7}) == 7
    uniform = tune_run.domain({"type": "uniform", "lower": 1, "upper": 2})
    assert isinstance(uniform, Float)
    assert (uniform.lower, uniform.upper) == (1, 2)
    assert isinstance(tune_run.domain({"type": "loguniform", "lower": 0.001, "upper": 1}), Float)
    assert isinstance(tune_run.domain({"type": "randint", "lower": 1, "upper": 9}), Integer)
    assert isinstance(tune_run.domain({"type": "choice", "values": ["a", "b"]}), Categorical)
    space = {"lr": {"type": "uniform", "lower": 0.1, "upper": 1}, "layers": {"type": "grid", "values": [1, 2]}}
    spec = {**TUNE_SPEC, "search_space": space, "scheduler_config": {}}
    assert isinstance(tune_run.scheduler({**spec, "scheduler": "fifo"}), FIFOScheduler)
    asha = tune_run.scheduler({**spec, "scheduler": "asha", "scheduler_config": {"grace_period": 2}})
    assert isinstance(asha, ASHAScheduler)
    pbt = tune_run.scheduler({**spec, "scheduler": "pbt"})
    assert isinstance(pbt, PopulationBasedTraining)
    assert set(pbt._hyperparam_mutations) == {"lr"}  # grid parameters cannot mutate


def test_serve_defaults_load_the_checkpoints_json_and_echo(tmp_path):
    (tmp_path / "model.json").write_text('{"w": 1}')
    (tmp_path / "weights.bin").write_bytes(b"\0")
    model = serve_deploy.default_load(str(tmp_path))
    assert model == {"checkpoint": str(tmp_path), "files": {"model.json": {"w": 1}}}
    assert serve_deploy.default_load("") == {"checkpoint": "", "files": {}}
    assert serve_deploy.default_predict({"x": 1}, model) == {
        "checkpoint": str(tmp_path),
        "model": {"model.json": {"w": 1}},
        "input": {"x": 1},
    }
    assert list(serve_deploy.default_stream({"prompt": "hi there"}, model)) == [
        {"token": "hi"},
        {"token": "there"},
        {"checkpoint": str(tmp_path)},
    ]


def test_serve_takes_the_users_functions_and_streams_server_sent_events():
    code = "def predict(payload, model):\n    return {'y': payload['x'] + model}\n\ndef load(path):\n    return 10\n"
    load, predict, stream = serve_deploy.user_functions(code)
    assert predict({"x": 1}, load("ckpt")) == {"y": 11}
    assert stream is serve_deploy.default_stream
    assert serve_deploy.user_functions("") == (
        serve_deploy.default_load,
        serve_deploy.default_predict,
        serve_deploy.default_stream,
    )
    assert serve_deploy.wants_stream("text/event-stream", {})
    assert serve_deploy.wants_stream("*/*", {"stream": True})
    assert not serve_deploy.wants_stream("application/json", {"stream": False})
    model = {"checkpoint": "c"}
    assert list(serve_deploy.sse_events(serve_deploy.default_stream, {"prompt": "a"}, model)) == [
        'data: {"token": "a"}\n\n',
        'data: {"checkpoint": "c"}\n\n',
        "data: [DONE]\n\n",
    ]


def test_serve_replicas_are_fixed_or_autoscaled():
    spec = {"cpus_per_replica": 1.0, "gpus_per_replica": 0.0, "num_replicas": 2, "autoscaling": False}
    assert serve_deploy.deployment_options(spec) == {
        "ray_actor_options": {"num_cpus": 1.0, "num_gpus": 0.0},
        "num_replicas": 2,
    }
    scaled = {**spec, "autoscaling": True, "autoscaling_config": {"min_replicas": 1, "max_replicas": 3}}
    assert serve_deploy.deployment_options(scaled)["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 3}
    assert "num_replicas" not in serve_deploy.deployment_options(scaled)

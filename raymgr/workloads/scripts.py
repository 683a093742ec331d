"""The Python programs Ray workload jobs run on the cluster (static text; each reads ctfleet_spec.json).

Every program prints result markers, ``CTFLEET {json}`` lines, that the agent's `ray.job.status` parses:
``{"kind": "checkpoint", "path": ..., "metrics": {...}}``, ``{"kind": "trial", ...}``, ``{"kind": "best", ...}``,
``{"kind": "deployed", ...}``. None of them imports torch unless the built-in fine-tune actually runs.
"""

from __future__ import annotations

# Helper module shipped with every job: spec, config, checkpoint directories and markers.
HELPER = '''"""ctfleet: what a training script needs from CleverThis Compute Fleet."""
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
'''

FINETUNE = '''"""Built-in fine-tune: Ray Train TorchTrainer (DDP / FSDP / DeepSpeed), optional LoRA."""
import os
import tempfile

import ctfleet
from ray.train import Checkpoint, CheckpointConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

SPEC = ctfleet.SPEC


def train_loop(cfg):
    import ray.train
    import ray.train.torch
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(cfg["model"])
    model = AutoModelForCausalLM.from_pretrained(cfg["model"])
    if cfg.get("lora"):
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", **cfg["lora"]))
    framework = cfg["framework"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=float(cfg.get("learning_rate", 2e-5)))
    if framework == "deepspeed":
        import deepspeed

        model, optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=cfg["deepspeed_config"]
        )
    else:
        model = ray.train.torch.prepare_model(model, parallel_strategy="fsdp" if framework == "torch_fsdp" else "ddp")
    with open(cfg["dataset"]) as f:
        texts = [line.strip() for line in f if line.strip()]
    rank, world = ray.train.get_context().get_world_rank(), ray.train.get_context().get_world_size()
    texts = texts[rank::world]
    every = int(cfg.get("checkpoint_every", 1))
    epochs = int(cfg.get("epochs", 1))
    for epoch in range(1, epochs + 1):
        total = 0.0
        for text in texts:
            batch = tokenizer(text, return_tensors="pt", truncation=True, max_length=int(cfg.get("max_length", 512)))
            batch = {k: v.to(ray.train.torch.get_device()) for k, v in batch.items()}
            loss = model(**batch, labels=batch["input_ids"]).loss
            if framework == "deepspeed":
                model.backward(loss)
                model.step()
            else:
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
            total += float(loss)
        metrics = {"epoch": epoch, "loss": total / max(1, len(texts))}
        if (every and epoch % every == 0) or epoch == epochs:
            with tempfile.TemporaryDirectory() as tmp:
                if rank == 0:
                    unwrapped = getattr(model, "module", model)
                    unwrapped.save_pretrained(tmp)
                    tokenizer.save_pretrained(tmp)
                ray.train.report(metrics, checkpoint=Checkpoint.from_directory(tmp))
        else:
            ray.train.report(metrics)


scaling = SPEC["scaling"]
trainer = TorchTrainer(
    train_loop,
    train_loop_config=dict(SPEC["config"], framework=SPEC["framework"]),
    scaling_config=ScalingConfig(
        num_workers=scaling["num_workers"],
        use_gpu=scaling["gpus_per_worker"] > 0,
        resources_per_worker={"CPU": scaling["cpus_per_worker"], "GPU": scaling["gpus_per_worker"]},
    ),
    run_config=RunConfig(
        name=SPEC["job"],
        storage_path=os.path.expanduser(SPEC.get("storage_path") or "~/ctfleet-checkpoints"),
        checkpoint_config=CheckpointConfig(num_to_keep=SPEC["checkpoints_to_keep"]),
    ),
)
result = trainer.fit()
if result.checkpoint is not None:
    ctfleet.report_checkpoint(result.checkpoint.path, **(result.metrics or {}))
'''

TUNE = '''"""A Ray Tune experiment; reports every trial result and the best config as CTFLEET markers."""
import json
import os

import ray
from ray import tune
from ray.tune import Callback
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, PopulationBasedTraining

with open("ctfleet_spec.json") as _f:
    SPEC = json.load(_f)
METRIC, MODE, MAX_ITER = SPEC["metric"], SPEC["mode"], int(SPEC["max_iterations"])


def emit(kind, **data):
    print("CTFLEET " + json.dumps(dict(kind=kind, **data), default=str), flush=True)


def domain(spec):
    kind = spec["type"]
    if kind == "uniform":
        return tune.uniform(spec["lower"], spec["upper"])
    if kind == "loguniform":
        return tune.loguniform(spec["lower"], spec["upper"])
    if kind == "randint":
        return tune.randint(spec["lower"], spec["upper"])
    if kind == "choice":
        return tune.choice(spec["values"])
    if kind == "grid":
        return tune.grid_search(spec["values"])
    return spec["value"]  # "constant"


def builtin_objective(config, report):
    """A deterministic test objective: best where every numeric parameter is 3."""
    distance = sum((float(v) - 3.0) ** 2 for v in config.values() if isinstance(v, (int, float)))
    for i in range(1, MAX_ITER + 1):
        loss = distance + 1.0 / i
        report({METRIC: -loss if MODE == "max" else loss})


_ns = {}
if SPEC.get("objective_code"):
    exec(compile(SPEC["objective_code"], "objective.py", "exec"), _ns)
objective = _ns.get("objective", builtin_objective)


# Ray releases before Tune had a RunConfig of its own report through ray.train (their tune.report raises).
RunConfig = getattr(tune, "RunConfig", None)
if RunConfig is None:
    from ray.train import RunConfig, report as _report
else:
    _report = tune.report


def trainable(config):
    objective(config, lambda metrics: _report(dict(metrics)))


def numeric(result):
    return {k: v for k, v in result.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


class Reporter(Callback):
    def on_trial_start(self, iteration, trials, trial, **info):
        emit("trial", trial_id=trial.trial_id, status="RUNNING", config=trial.config)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        emit(
            "trial",
            trial_id=trial.trial_id,
            status="RUNNING",
            config=trial.config,
            iteration=result.get("training_iteration", 0),
            metric=result.get(METRIC),
            result=numeric(result),
        )

    def on_trial_complete(self, iteration, trials, trial, **info):
        emit("trial", trial_id=trial.trial_id, status="TERMINATED", config=trial.config)

    def on_trial_error(self, iteration, trials, trial, **info):
        emit("trial", trial_id=trial.trial_id, status="ERROR", config=trial.config)


def scheduler():
    name, cfg = SPEC["scheduler"], SPEC.get("scheduler_config") or {}
    if name == "asha":
        return ASHAScheduler(
            time_attr="training_iteration",
            max_t=int(cfg.get("max_t", MAX_ITER)),
            grace_period=int(cfg.get("grace_period", 1)),
            reduction_factor=float(cfg.get("reduction_factor", 2)),
        )
    if name == "pbt":
        mutations = {k: domain(v) for k, v in SPEC["search_space"].items() if v["type"] != "grid"}
        return PopulationBasedTraining(
            time_attr="training_iteration",
            perturbation_interval=float(cfg.get("perturbation_interval", 2)),
            hyperparam_mutations=mutations,
        )
    return FIFOScheduler()


ray.init(address=os.environ.get("RAY_ADDRESS", "auto"))
tuner = tune.Tuner(
    tune.with_resources(trainable, {"cpu": SPEC["cpus_per_trial"], "gpu": SPEC["gpus_per_trial"]}),
    param_space={k: domain(v) for k, v in SPEC["search_space"].items()},
    tune_config=tune.TuneConfig(
        metric=METRIC,
        mode=MODE,
        num_samples=int(SPEC["num_samples"]),
        max_concurrent_trials=int(SPEC["max_concurrent_trials"]),
        scheduler=scheduler(),
    ),
    run_config=RunConfig(
        name=SPEC["job"],
        storage_path=os.path.expanduser(SPEC.get("storage_path") or "~/ray_results"),
        callbacks=[Reporter()],
        verbose=0,
    ),
)
results = tuner.fit()
best = results.get_best_result(metric=METRIC, mode=MODE)
emit("best", config=best.config, metrics=numeric(best.metrics or {}))
'''

SERVE = '''"""Deploy (or delete) one Ray Serve application; the app outlives this job."""
import inspect
import json
import os

import ray
from ray import serve

with open("ctfleet_spec.json") as _f:
    SPEC = json.load(_f)


def emit(kind, **data):
    print("CTFLEET " + json.dumps(dict(kind=kind, **data), default=str), flush=True)


def default_load(path):
    files = {}
    if path and os.path.isdir(path):
        for name in sorted(os.listdir(path)):
            if name.endswith(".json"):
                with open(os.path.join(path, name)) as f:
                    files[name] = json.load(f)
    return {"checkpoint": path, "files": files}


def default_predict(payload, model):
    return {"checkpoint": model["checkpoint"], "model": model["files"], "input": payload}


def default_stream(payload, model):
    for word in str(payload.get("prompt", "")).split():
        yield {"token": word}
    yield {"checkpoint": model["checkpoint"]}


def python_app(spec):
    from starlette.responses import JSONResponse, StreamingResponse

    options = {"ray_actor_options": {"num_cpus": spec["cpus_per_replica"], "num_gpus": spec["gpus_per_replica"]}}
    if spec["autoscaling"]:
        options["autoscaling_config"] = spec["autoscaling_config"]
    else:
        options["num_replicas"] = spec["num_replicas"]

    @serve.deployment(name="model", **options)
    class Model:
        def __init__(self, checkpoint, code):
            ns = {}
            if code:
                exec(compile(code, "deployment.py", "exec"), ns)
            self.predict = ns.get("predict", default_predict)
            self.stream = ns.get("stream", default_stream)
            self.model = ns.get("load", default_load)(checkpoint)

        async def __call__(self, request):
            body = await request.body()
            payload = json.loads(body) if body else dict(request.query_params)
            wants_sse = "text/event-stream" in request.headers.get("accept", "") or payload.get("stream")
            if wants_sse:
                def events():
                    for chunk in self.stream(payload, self.model):
                        yield "data: " + json.dumps(chunk) + "\\n\\n"
                    yield "data: [DONE]\\n\\n"

                return StreamingResponse(events(), media_type="text/event-stream")
            return JSONResponse(self.predict(payload, self.model))

    return Model.bind(spec["checkpoint_path"], spec["code"])


def vllm_app(spec):
    from ray.serve.llm import LLMConfig, build_openai_app

    llm = LLMConfig(
        model_loading_config={"model_id": spec["name"], "model_source": spec["checkpoint_path"] or spec["model"]},
        deployment_config=spec["deployment_config"],
        engine_kwargs=spec.get("engine_kwargs") or {},
    )
    return build_openai_app({"llm_configs": [llm]})


ray.init(address=os.environ.get("RAY_ADDRESS", "auto"))
serve.start(http_options={"host": SPEC["http_host"], "port": SPEC["http_port"]})
if SPEC["action"] == "delete":
    serve.delete(SPEC["app_name"])
    emit("deleted", app=SPEC["app_name"])
else:
    app = vllm_app(SPEC) if SPEC["engine"] == "vllm" else python_app(SPEC)
    # Newer Ray blocks in serve.run unless told not to; older releases have no such argument (and return).
    wait = {"blocking": False} if "blocking" in inspect.signature(serve.run).parameters else {}
    serve.run(app, name=SPEC["app_name"], route_prefix=SPEC["route_prefix"], **wait)
    emit("deployed", app=SPEC["app_name"], port=SPEC["http_port"], route_prefix=SPEC["route_prefix"])
'''

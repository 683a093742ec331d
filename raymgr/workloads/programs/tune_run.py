"""A Ray Tune experiment; reports every trial result and the best config as CTFLEET markers.

Runs as ``python tune_run.py`` next to ``ctfleet.py`` and ``ctfleet_spec.json``: the search space, metric and mode, the
scheduler, and optionally the user's ``objective(config, report)`` as source code.
"""

import functools
import os

try:  # in the job's working dir: ctfleet.py is shipped next to this program
    from ctfleet import emit, load_spec
except ImportError:  # imported from the control plane's package (its tests)
    from raymgr.workloads.programs.ctfleet import emit, load_spec


def domain(spec):
    """The Tune search domain of one parameter's spec (a constant is its value)."""
    from ray import tune

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


def builtin_objective(config, report, *, metric, mode, max_iterations):
    """A deterministic test objective: best where every numeric parameter is 3."""
    distance = sum((float(v) - 3.0) ** 2 for v in config.values() if isinstance(v, (int, float)))
    for i in range(1, max_iterations + 1):
        loss = distance + 1.0 / i
        report({metric: -loss if mode == "max" else loss})


def objective_for(spec):
    """The user's ``objective(config, report)`` from ``objective_code``, else `builtin_objective`."""
    namespace = {}
    if spec.get("objective_code"):
        exec(compile(spec["objective_code"], "objective.py", "exec"), namespace)
    builtin = functools.partial(
        builtin_objective, metric=spec["metric"], mode=spec["mode"], max_iterations=int(spec["max_iterations"])
    )
    return namespace.get("objective", builtin)


def make_trainable(objective, report):
    """The Tune function trainable: `objective` reporting through `report` (a dict each time)."""

    def trainable(config):
        objective(config, lambda metrics: report(dict(metrics)))

    return trainable


def tune_api():
    """(RunConfig, report) of this Ray: releases before Tune had a RunConfig of its own report through
    ray.train (their tune.report raises)."""
    from ray import tune

    run_config = getattr(tune, "RunConfig", None)
    if run_config is None:
        from ray.train import RunConfig, report

        return RunConfig, report
    return run_config, tune.report


def numeric(result):
    """The numeric (non-boolean) entries of a Tune result."""
    return {k: v for k, v in result.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def reporter(metric):
    """A Tune callback printing a ``trial`` marker at each trial's start, result, end and error."""
    from ray.tune import Callback

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
                metric=result.get(metric),
                result=numeric(result),
            )

        def on_trial_complete(self, iteration, trials, trial, **info):
            emit("trial", trial_id=trial.trial_id, status="TERMINATED", config=trial.config)

        def on_trial_error(self, iteration, trials, trial, **info):
            emit("trial", trial_id=trial.trial_id, status="ERROR", config=trial.config)

    return Reporter()


def scheduler(spec):
    """The trial scheduler the spec names (ASHA, PBT, else FIFO)."""
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, PopulationBasedTraining

    name, cfg = spec["scheduler"], spec.get("scheduler_config") or {}
    max_iterations = int(spec["max_iterations"])
    if name == "asha":
        return ASHAScheduler(
            time_attr="training_iteration",
            max_t=int(cfg.get("max_t", max_iterations)),
            grace_period=int(cfg.get("grace_period", 1)),
            reduction_factor=float(cfg.get("reduction_factor", 2)),
        )
    if name == "pbt":
        mutations = {k: domain(v) for k, v in spec["search_space"].items() if v["type"] != "grid"}
        return PopulationBasedTraining(
            time_attr="training_iteration",
            perturbation_interval=float(cfg.get("perturbation_interval", 2)),
            hyperparam_mutations=mutations,
        )
    return FIFOScheduler()


def main():
    """Run the experiment on the cluster at RAY_ADDRESS and print the best trial."""
    import ray
    from ray import tune

    spec = load_spec()
    metric, mode = spec["metric"], spec["mode"]
    run_config, report = tune_api()
    ray.init(address=os.environ.get("RAY_ADDRESS", "auto"))
    tuner = tune.Tuner(
        tune.with_resources(
            make_trainable(objective_for(spec), report), {"cpu": spec["cpus_per_trial"], "gpu": spec["gpus_per_trial"]}
        ),
        param_space={k: domain(v) for k, v in spec["search_space"].items()},
        tune_config=tune.TuneConfig(
            metric=metric,
            mode=mode,
            num_samples=int(spec["num_samples"]),
            max_concurrent_trials=int(spec["max_concurrent_trials"]),
            scheduler=scheduler(spec),
        ),
        run_config=run_config(
            name=spec["job"],
            storage_path=os.path.expanduser(spec.get("storage_path") or "~/ray_results"),
            callbacks=[reporter(metric)],
            verbose=0,
        ),
    )
    results = tuner.fit()
    best = results.get_best_result(metric=metric, mode=mode)
    emit("best", config=best.config, metrics=numeric(best.metrics or {}))


if __name__ == "__main__":
    main()

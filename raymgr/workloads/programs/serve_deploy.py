"""Deploy (or delete) one Ray Serve application; the app outlives this job.

Runs as ``python serve_deploy.py`` next to ``ctfleet.py`` and ``ctfleet_spec.json``. The ``python`` engine
serves a checkpoint with the user's ``load``/``predict``/``stream`` (source code in the spec) or the defaults below; the
``vllm`` engine serves an OpenAI-compatible LLM app.
"""

import inspect
import json
import os

try:  # in the job's working dir: ctfleet.py is shipped next to this program
    from ctfleet import emit, load_spec
except ImportError:  # imported from the control plane's package (its tests)
    from raymgr.workloads.programs.ctfleet import emit, load_spec


def default_load(path):
    """The checkpoint's path and its JSON files, by name."""
    files = {}
    if path and os.path.isdir(path):
        for name in sorted(os.listdir(path)):
            if name.endswith(".json"):
                with open(os.path.join(path, name)) as f:
                    files[name] = json.load(f)
    return {"checkpoint": path, "files": files}


def default_predict(payload, model):
    """Echo the request with what was loaded."""
    return {"checkpoint": model["checkpoint"], "model": model["files"], "input": payload}


def default_stream(payload, model):
    """One chunk per word of the prompt, then the checkpoint."""
    for word in str(payload.get("prompt", "")).split():
        yield {"token": word}
    yield {"checkpoint": model["checkpoint"]}


def user_functions(code):
    """(load, predict, stream) from the user's deployment code, each defaulting to ours."""
    namespace = {}
    if code:
        exec(compile(code, "deployment.py", "exec"), namespace)
    return (
        namespace.get("load", default_load),
        namespace.get("predict", default_predict),
        namespace.get("stream", default_stream),
    )


def wants_stream(accept, payload):
    """True when the request asks for server-sent events (Accept header or ``stream`` in the payload)."""
    return "text/event-stream" in accept or bool(payload.get("stream"))


def sse_events(stream, payload, model):
    """Server-sent events of what `stream(payload, model)` yields (JSON each), ending with ``[DONE]``."""
    for chunk in stream(payload, model):
        yield "data: " + json.dumps(chunk) + "\n\n"
    yield "data: [DONE]\n\n"


def deployment_options(spec):
    """The Serve deployment's replicas (fixed or autoscaled) and per-replica resources."""
    options = {"ray_actor_options": {"num_cpus": spec["cpus_per_replica"], "num_gpus": spec["gpus_per_replica"]}}
    if spec["autoscaling"]:
        options["autoscaling_config"] = spec["autoscaling_config"]
    else:
        options["num_replicas"] = spec["num_replicas"]
    return options


def python_app(spec):
    """The ``python`` engine's app: the checkpoint behind the user's (or default) functions."""
    from ray import serve
    from starlette.responses import JSONResponse, StreamingResponse

    @serve.deployment(name="model", **deployment_options(spec))
    class Model:
        def __init__(self, checkpoint, code):
            load, self.predict, self.stream = user_functions(code)
            self.model = load(checkpoint)

        async def __call__(self, request):
            body = await request.body()
            payload = json.loads(body) if body else dict(request.query_params)
            if wants_stream(request.headers.get("accept", ""), payload):
                events = sse_events(self.stream, payload, self.model)
                return StreamingResponse(events, media_type="text/event-stream")
            return JSONResponse(self.predict(payload, self.model))

    return Model.bind(spec["checkpoint_path"], spec["code"])


def vllm_app(spec):
    """The ``vllm`` engine's app: Ray Serve LLM's OpenAI-compatible app for the model or checkpoint."""
    from ray.serve.llm import LLMConfig, build_openai_app

    llm = LLMConfig(
        model_loading_config={"model_id": spec["name"], "model_source": spec["checkpoint_path"] or spec["model"]},
        deployment_config=spec["deployment_config"],
        engine_kwargs=spec.get("engine_kwargs") or {},
    )
    return build_openai_app({"llm_configs": [llm]})


def main():
    """Deploy or delete the spec's application on the cluster at RAY_ADDRESS."""
    import ray
    from ray import serve

    spec = load_spec()
    ray.init(address=os.environ.get("RAY_ADDRESS", "auto"))
    serve.start(http_options={"host": spec["http_host"], "port": spec["http_port"]})
    if spec["action"] == "delete":
        serve.delete(spec["app_name"])
        emit("deleted", app=spec["app_name"])
        return
    app = vllm_app(spec) if spec["engine"] == "vllm" else python_app(spec)
    # Newer Ray blocks in serve.run unless told not to; older releases have no such argument (and return).
    wait = {"blocking": False} if "blocking" in inspect.signature(serve.run).parameters else {}
    serve.run(app, name=spec["app_name"], route_prefix=spec["route_prefix"], **wait)
    emit("deployed", app=spec["app_name"], port=spec["http_port"], route_prefix=spec["route_prefix"])


if __name__ == "__main__":
    main()

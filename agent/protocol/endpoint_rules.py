"""What an endpoint's server may be told and what it holds on its node: one definition for both sides.

The control plane (the API, the pages, the services and the quota admission) and the agent (which refuses
too, before it starts anything) read the same rules from here:

- `check_server_args`: an endpoint's server arguments (`server_args`, carried as endpoint.start's
  `extra_args`) are an ALLOW-LIST of vLLM flags (`ENDPOINT_SERVER_FLAGS`), each value checked by type and
  range. Flags the agent sets itself (`ENDPOINT_AGENT_ARGS`) and flags that name a local path, load code or
  send data off the node (`ENDPOINT_REFUSED_FLAGS`) are refused by name with the reason; any other flag is
  refused as not allowed. vLLM runs on the node's host as the agent's child: a flag outside this list could
  read the node's files or run code there.
- `endpoint_gpus_held` / `endpoint_vram_held_mb`: what one replica really holds on its node. On a node with
  GPUs the agent always pins at least one GPU (vLLM's CUDA build needs one), so an endpoint asking 0 GPUs
  holds 1 there; vLLM takes `--gpu-memory-utilization` (0.9 by default) of each pinned GPU's memory.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from agent.protocol.rules import MAX_ITEMS

MAX_SERVER_ARGS = MAX_ITEMS
MAX_SERVER_ARG_LENGTH = 500
# "--max-model-len 2048" given as one item: an option and its value, split in two as a shell would.
_OPTION_AND_VALUE = re.compile(r"^(--?[A-Za-z][A-Za-z0-9_.-]*)\s+(\S.*)$", re.DOTALL)
_FLAG = re.compile(r"^--[a-z][a-z0-9-]*$")
_INT = re.compile(r"^-?[0-9]{1,12}$")
_FLOAT = re.compile(r"^[0-9]{1,9}(\.[0-9]{1,9})?$|^\.[0-9]{1,9}$")
_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
_JSON_KEY = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
MAX_JSON_ITEMS = 32

# Server flags the agent sets itself on every endpoint server (`agent.workloads.endpoints.server_argv`),
# each with why: `extra_args` may not give them (a later flag would win in vLLM and break the endpoint).
# `--config` (a YAML file of flags) and `--uds` (serve on a socket instead of the port) would replace them.
ENDPOINT_AGENT_ARGS: dict[str, str] = {
    "--model": "the agent serves the endpoint's model from its node's cache",
    "--served-model-name": "the agent names the served model after the endpoint's model id",
    "--port": "the agent picks the server's port",
    "--host": "the agent binds the server to 127.0.0.1, reached through the tunnel only",
    "--uds": "the agent reaches the server on its port",
    "--tensor-parallel-size": "the agent sets it from the endpoint's GPUs",
    "-tp": "the agent sets --tensor-parallel-size from the endpoint's GPUs",
    "--config": "a config file could set the flags the agent sets itself",
}

_RUNS_CODE = "it runs Python code named by the endpoint on the node"
_READS_FILES = "it reads files from the node's disk"
# Flags refused by name, each with why: they name a local path, import code, or send data off the node.
# Any flag not in `ENDPOINT_SERVER_FLAGS` is refused too; these get their reason in the message.
ENDPOINT_REFUSED_FLAGS: dict[str, str] = {
    "--trust-remote-code": "it runs the model repository's Python code on the node",
    "--tool-parser-plugin": _RUNS_CODE,
    "--reasoning-parser-plugin": _RUNS_CODE,
    "--middleware": _RUNS_CODE,
    "--worker-cls": _RUNS_CODE,
    "--worker-extension-cls": _RUNS_CODE,
    "--scheduler-cls": _RUNS_CODE,
    "--logits-processors": _RUNS_CODE,
    "--io-processor-plugin": _RUNS_CODE,
    "--model-impl": "it chooses which code loads the model",
    "--hf-overrides": "it can point the model at remote code",
    "--compilation-config": "it can name compiler passes to import",
    "--speculative-config": "it names a draft model to load from a path",
    "--kv-transfer-config": "it loads a connector module and opens connections off the node",
    "--allowed-local-media-path": "it serves the node's files to requests",
    "--lora-modules": "it loads adapters from paths on the node (attach adapters to the endpoint instead)",
    "--generation-config": "it reads a folder on the node",
    "--tokenizer": "it loads a tokenizer from a path on the node or the Hub",
    "--hf-config-path": _READS_FILES,
    "--download-dir": "it writes outside the node's model cache",
    "--load-format": "it chooses a loader plugin",
    "--model-loader-extra-config": _READS_FILES,
    "--ssl-keyfile": _READS_FILES,
    "--ssl-certfile": _READS_FILES,
    "--ssl-ca-certs": _READS_FILES,
    "--log-config-file": _READS_FILES,
    "--logging-config": _READS_FILES,
    "--otlp-traces-endpoint": "it sends request traces to a host off the node",
    "--tool-server": "it connects the server to another host",
    "--profiler-config": "it writes profiles to a folder on the node",
    "--api-key": "the control plane authenticates callers; the agent must reach its own server",
    "--root-path": "the agent reaches the server at its root",
    "--headless": "the endpoint must serve HTTP",
    "--grpc": "the endpoint must serve HTTP",
    "--distributed-executor-backend": "the endpoint runs on its own node",
    "--data-parallel-address": "the endpoint runs on its own node",
    "--data-parallel-size": "the endpoint runs on its own node",
    "--pipeline-parallel-size": "the agent places the endpoint on the GPUs it counts",
    "--hf-token": "the node's own Hub credentials serve the model cache",
}

FlagKind = Literal["switch", "int", "float", "choice", "name", "json", "template"]


@dataclass(frozen=True)
class ServerFlag:
    """One vLLM flag an endpoint may set: what its value must be (`kind`, range or choices)."""

    kind: FlagKind
    low: float = 0
    high: float = 0
    choices: tuple[str, ...] = ()
    negatable: bool = True  # a switch also takes its `--no-` form (argparse BooleanOptionalAction)

    def describe(self) -> str:
        """The value it takes, in words (the README's table and the refusal messages)."""
        if self.kind == "switch":
            return "no value" + (" (`--no-` form too)" if self.negatable else "")
        if self.kind == "int":
            return f"an integer from {int(self.low)} to {int(self.high)}"
        if self.kind == "float":
            return f"a number from {self.low:g} to {self.high:g}"
        if self.kind == "choice":
            return "one of " + ", ".join(self.choices)
        if self.kind == "name":
            return "a built-in parser's name (lowercase letters, digits, '-' and '_')"
        if self.kind == "json":
            return "a JSON object of plain values (numbers, strings, booleans, lists of them)"
        return "an inline Jinja template (holding '{{' or '{%'), never a file name"


def _int(low: float, high: float) -> ServerFlag:
    return ServerFlag("int", low, high)


def _switch(negatable: bool = True) -> ServerFlag:
    return ServerFlag("switch", negatable=negatable)


MAX_TOKENS = 10_000_000
DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
# The vLLM flags an endpoint may set, with their values' bounds: as vLLM 0.32 spells them (its parser takes
# each: tests/agent/test_endpoint_rules.py), and `--swap-space`, which the older GPU builds still take.
ENDPOINT_SERVER_FLAGS: dict[str, ServerFlag] = {
    # model and memory
    "--max-model-len": _int(1, MAX_TOKENS),
    "--dtype": ServerFlag("choice", choices=DTYPES),
    "--quantization": ServerFlag(
        "choice",
        choices=(
            "awq",
            "awq_marlin",
            "gptq",
            "gptq_marlin",
            "fp8",
            "fbgemm_fp8",
            "bitsandbytes",
            "compressed-tensors",
            "experts_int8",
            "gguf",
            "marlin",
            "modelopt",
            "mxfp4",
        ),
    ),
    "--kv-cache-dtype": ServerFlag("choice", choices=("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")),
    "--gpu-memory-utilization": ServerFlag("float", 0.05, 1.0),
    "--num-gpu-blocks-override": _int(1, 100_000_000),  # KV cache blocks (CPU too, over VLLM_CPU_KVCACHE_SPACE)
    "--swap-space": ServerFlag("float", 0, 1024),
    "--cpu-offload-gb": ServerFlag("float", 0, 1024),
    "--block-size": ServerFlag("choice", choices=("1", "8", "16", "32", "64", "128")),
    "--enforce-eager": _switch(),
    "--enable-prefix-caching": _switch(),
    "--prefix-caching-hash-algo": ServerFlag("choice", choices=("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")),
    "--disable-sliding-window": _switch(),
    "--disable-cascade-attn": _switch(),
    "--disable-custom-all-reduce": _switch(),
    "--seed": _int(0, 2**32 - 1),
    # LoRA adapters: the control plane loads and unloads them at run time (vLLM's /v1/load_lora_adapter), never
    # from paths given here (`--lora-modules` is refused)
    "--enable-lora": _switch(),
    "--max-loras": _int(1, 256),
    "--max-lora-rank": ServerFlag("choice", choices=("1", "8", "16", "32", "64", "128", "256", "320", "512")),
    "--max-cpu-loras": _int(1, 1024),
    # scheduling
    "--max-num-seqs": _int(1, 65_536),
    "--max-num-batched-tokens": _int(1, MAX_TOKENS),
    "--enable-chunked-prefill": _switch(),
    "--long-prefill-token-threshold": _int(0, MAX_TOKENS),
    "--scheduling-policy": ServerFlag("choice", choices=("fcfs", "priority")),
    "--async-scheduling": _switch(),
    "--stream-interval": _int(1, 1024),
    # the OpenAI server's answers
    "--max-logprobs": _int(0, 1_000_000),
    "--chat-template": ServerFlag("template"),
    "--chat-template-content-format": ServerFlag("choice", choices=("auto", "string", "openai")),
    "--response-role": ServerFlag("name"),
    "--override-generation-config": ServerFlag("json"),
    "--enable-auto-tool-choice": _switch(),
    "--tool-call-parser": ServerFlag("name"),
    "--reasoning-parser": ServerFlag("name"),
    "--return-tokens-as-token-ids": _switch(),
    "--enable-prompt-tokens-details": _switch(),
    "--enable-force-include-usage": _switch(),
    "--max-log-len": _int(0, 1_000_000),
    "--disable-log-stats": _switch(negatable=False),
    "--uvicorn-log-level": ServerFlag("choice", choices=("critical", "error", "warning", "info", "debug")),
}


_SWITCHES = frozenset(flag[2:] for flag, spec in ENDPOINT_SERVER_FLAGS.items() if spec.kind == "switch")


def endpoint_arg_reserved(arg: str) -> str | None:
    """The flag of `ENDPOINT_AGENT_ARGS` that server argument `arg` would set (None when it sets none).

    Reads it as vLLM's parser would: `--flag=value`, underscores for dashes (`--max_model_len`), and a
    long option's unambiguous abbreviation (`--por` is `--port` to argparse).
    """
    if not arg.startswith("-") or arg.startswith("---"):
        return None
    name = arg.split("=", 1)[0]
    if name in ENDPOINT_AGENT_ARGS:
        return name
    if name.startswith("-tp"):  # argparse reads `-tp2` as `-tp 2`
        return "-tp"
    return _read_as(name, ENDPOINT_AGENT_ARGS)


def _canonical(name: str) -> str:
    """A long flag as vLLM reads it: underscores become dashes (up to a '.', vLLM's nested keys)."""
    return "--" + name[2:].replace("_", "-") if name.startswith("--") else name


def _read_as(name: str, flags: Iterable[str]) -> str | None:
    """The flag of `flags` that `name` is, or abbreviates (argparse's `allow_abbrev`), as vLLM reads it."""
    if not name.startswith("--") or len(name) < 3:
        return None
    name = _canonical(name)
    for flag in flags:
        if flag.startswith("--") and flag.startswith(name):
            return flag
    return None


def split_server_args(value: Sequence[str]) -> list[str]:
    """`"--max-model-len 2048"` given as one item becomes two, as a shell would split it."""
    args: list[str] = []
    for arg in value:
        match = _OPTION_AND_VALUE.match(arg)
        args += [match.group(1), match.group(2)] if match else [arg]
    return args


def _plain_json(value: Any) -> bool:
    if isinstance(value, bool) or value is None:
        return True
    if isinstance(value, int | float):
        return math.isfinite(value)
    return isinstance(value, str) and len(value) <= 200


def _value_problem(flag: str, spec: ServerFlag, value: str, exists: Callable[[str], bool] | None) -> str | None:
    """Why `value` is not a value `flag` may take (None when it is)."""
    shown = value if len(value) <= 40 else value[:40] + "…"
    wants = f"{flag} {shown!r}: must be {spec.describe()}."
    if spec.kind == "int":
        return None if _INT.match(value) and spec.low <= int(value) <= spec.high else wants
    if spec.kind == "float":
        return None if _FLOAT.match(value) and spec.low <= float(value) <= spec.high else wants
    if spec.kind == "choice":
        return None if value in spec.choices else wants
    if spec.kind == "name":
        return None if _NAME.match(value) else wants
    if spec.kind == "json":
        try:
            parsed = json.loads(value)
        except ValueError:
            return wants
        if not isinstance(parsed, dict) or len(parsed) > MAX_JSON_ITEMS:
            return wants
        for key, item in parsed.items():
            items = item if isinstance(item, list) else [item]
            if not _JSON_KEY.match(key) or len(items) > MAX_JSON_ITEMS or not all(_plain_json(i) for i in items):
                return wants
        return None
    # template: vLLM opens the value as a file first and uses it as a template only when that fails.
    if value.startswith(("-", "/", "~", ".")) or ("{{" not in value and "{%" not in value):
        return f"{flag} {shown!r}: must be an inline Jinja template (holding '{{{{' or '{{%'), never a file name."
    if exists is not None and exists(value):
        return f"{flag} {shown!r}: names a file on this node; give the template itself."
    return None


def check_server_args(value: Any, *, exists: Callable[[str], bool] | None = None) -> tuple[list[str], list[str]]:
    """Read an endpoint's server arguments against the allow-list: (the arguments as the server takes them,
    the problems, each a sentence naming the argument). No problems: the arguments are safe to pass to vLLM.

    `value` must be a list of strings (an option and its value in one item are split in two), at most
    `MAX_SERVER_ARGS` of at most `MAX_SERVER_ARG_LENGTH` characters. Every argument is a flag of
    `ENDPOINT_SERVER_FLAGS` (`--flag value`, `--flag=value`, a switch alone or as `--no-flag`; underscores
    read as dashes, as vLLM does) followed by a value of its kind; `exists` (the agent's check) refuses a
    template that is the name of a file on the node.
    """
    if not isinstance(value, list | tuple) or not all(isinstance(arg, str) for arg in value):
        return [], ["Must be a list of strings, one server argument each."]
    if len(value) > MAX_SERVER_ARGS:  # before looking at each one
        return [], [f"At most {MAX_SERVER_ARGS} arguments (got {len(value)})."]
    args = split_server_args(value)
    problems: list[str] = []
    if len(args) > MAX_SERVER_ARGS:
        problems.append(f"At most {MAX_SERVER_ARGS} arguments (got {len(args)}).")
    for arg in args:
        shown = arg if len(arg) <= 40 else arg[:40] + "…"
        if len(arg) > MAX_SERVER_ARG_LENGTH:
            problems.append(f"{shown!r}: at most {MAX_SERVER_ARG_LENGTH} characters per argument.")
        elif "\x00" in arg:
            problems.append(f"{shown!r}: an argument cannot hold a NUL character.")
    if problems:
        return [], problems
    kept: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        shown = arg if len(arg) <= 40 else arg[:40] + "…"
        name, _, given_text = arg.partition("=")
        given = given_text if arg.startswith("--") and "=" in arg else None
        if not arg.startswith("--"):
            name = arg
        refusal = _refusal(arg, name, shown)
        if refusal is not None:
            problems.append(refusal)
            if given is None and i < len(args) and not args[i].startswith("-"):
                i += 1  # its value: one message per refused flag
            continue
        flag = _canonical(name)
        negated = flag.startswith("--no-") and flag[len("--no-") :] in _SWITCHES
        lookup = "--" + flag[len("--no-") :] if negated else flag
        spec = ENDPOINT_SERVER_FLAGS[lookup]
        if spec.kind == "switch":
            if given is not None:
                problems.append(f"{flag} takes no value (leave it out, or give --no-{lookup[2:]}, to turn it off).")
            elif negated and not spec.negatable:
                problems.append(f"{flag} is not a server flag an endpoint may set (leave {lookup} out instead).")
            else:
                kept.append(flag)
            continue
        if negated:
            problems.append(f"{flag} is not a server flag an endpoint may set.")
            continue
        if given is None:
            if i >= len(args):
                problems.append(f"{flag} needs a value: {spec.describe()}.")
                continue
            given = args[i]
            i += 1
            problem = _value_problem(flag, spec, given, exists)
            if problem is None:
                kept += [flag, given]
        else:
            problem = _value_problem(flag, spec, given, exists)
            if problem is None:
                kept.append(f"{flag}={given}")
        if problem is not None:
            problems.append(problem)
    return (kept, []) if not problems else ([], problems)


def _refusal(arg: str, name: str, shown: str) -> str | None:
    """Why flag `arg` (named `name`, shown as `shown`) may not be given; None when it is an allowed flag."""
    if (reserved := endpoint_arg_reserved(arg)) is not None:
        said = reserved if name == reserved else f"{shown!r} (read by vLLM as {reserved})"
        return f"{said} is set by the agent itself ({ENDPOINT_AGENT_ARGS[reserved]}): leave it out."
    if not arg.startswith("-"):
        return f"{shown!r} is not a flag: each server argument is an allowed --flag, then its value if it takes one."
    flag = _canonical(name)
    if flag in ENDPOINT_SERVER_FLAGS or (flag.startswith("--no-") and flag[len("--no-") :] in _SWITCHES):
        return None
    positive = "--" + flag[len("--no-") :] if flag.startswith("--no-") else flag
    if positive in ENDPOINT_REFUSED_FLAGS:
        return f"{flag} is refused: {ENDPOINT_REFUSED_FLAGS[positive]}."
    if (refused := _read_as(name, ENDPOINT_REFUSED_FLAGS)) is not None:
        return f"{shown!r} (read by vLLM as {refused}) is refused: {ENDPOINT_REFUSED_FLAGS[refused]}."
    said = flag if _FLAG.match(flag) else repr(shown)
    return f"{said} is not a server flag an endpoint may set (the README's security section lists them)."


# ---- what a replica holds on its node


DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default share of each GPU it runs on


def endpoint_gpus_held(*, gpus: int, min_vram_mb: int, node_gpus: int) -> int:
    """GPUs one replica of an endpoint asking `gpus` (and `min_vram_mb`) pins on a node with `node_gpus`: on a
    GPU node at least one (vLLM's CUDA build runs there), on a CPU node none unless GPUs or VRAM are asked
    (the agent then refuses the start: it cannot hold them)."""
    if node_gpus <= 0 and gpus <= 0 and min_vram_mb <= 0:
        return 0
    return max(gpus, 1)


def server_memory_share(server_args: Sequence[str]) -> float:
    """The share of each pinned GPU's memory vLLM takes with these (checked) server arguments."""
    share = DEFAULT_GPU_MEMORY_UTILIZATION
    for i, arg in enumerate(server_args):
        if arg == "--gpu-memory-utilization" and i + 1 < len(server_args):
            share = float(server_args[i + 1])
        elif arg.startswith("--gpu-memory-utilization="):
            share = float(arg.split("=", 1)[1])
    return share


def _gpu_value(gpu: Any, name: str) -> int:
    return int(gpu.get(name, 0) if isinstance(gpu, Mapping) else getattr(gpu, name, 0))


def select_gpus(gpus: Sequence[Any], count: int) -> list[Any]:
    """The `count` GPUs with the most free memory (by index on ties): the ones the agent pins. Each GPU is a
    `GpuInfo` or a mapping of its fields (`index`, `memory_total_mb`, `memory_used_mb`; a node's row)."""

    def rank(g: Any) -> tuple[int, int]:
        return (_gpu_value(g, "memory_used_mb") - _gpu_value(g, "memory_total_mb"), _gpu_value(g, "index"))

    return sorted(gpus, key=rank)[:count]


def endpoint_vram_held_mb(
    *, gpus: int, min_vram_mb: int, node_gpus: Sequence[Any], server_args: Sequence[str] = ()
) -> int:
    """VRAM (MB) one replica holds on a node with GPUs `node_gpus` (as `select_gpus` takes them): its
    `server_args`' memory share (vLLM's `--gpu-memory-utilization`, 0.9 by default) of the GPUs it pins,
    and never less than the `min_vram_mb` it asked; 0 where it pins none."""
    held = endpoint_gpus_held(gpus=gpus, min_vram_mb=min_vram_mb, node_gpus=len(node_gpus))
    if held == 0:
        return 0
    total = sum(_gpu_value(g, "memory_total_mb") for g in select_gpus(node_gpus, held))
    return max(min_vram_mb, math.ceil(total * server_memory_share(server_args)))

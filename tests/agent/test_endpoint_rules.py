"""`agent.protocol.endpoint_rules`: the allow-list of server flags an endpoint may set (each value checked
by type and range; flags naming a local path or an import refused by name) and what one replica holds on
its node (on a GPU node at least one GPU, and vLLM's share of its memory). Both sides import these."""

from __future__ import annotations

import pytest

from agent import protocol
from agent.protocol import check_server_args, endpoint_gpus_held, endpoint_vram_held_mb
from tests.support.environment import missing

# The flags the tests and benches use, and the ones the issue names as safe to keep.
SAFE = [
    "--max-model-len",
    "2048",
    "--max-num-seqs",
    "8",
    "--enable-prefix-caching",
    "--dtype",
    "bfloat16",
    "--enforce-eager",
    "--gpu-memory-utilization",
    "0.85",
    "--swap-space",
    "4",
    "--block-size",
    "16",
    "--max-num-batched-tokens",
    "4096",
    "--kv-cache-dtype",
    "fp8",
    "--quantization",
    "awq",
    "--seed",
    "7",
    "--no-enable-chunked-prefill",
    "--chat-template",
    "{{ messages[0]['content'] }}",
    "--override-generation-config",
    '{"temperature": 0.5, "stop": ["</s>"]}',
]


def test_the_safe_flags_pass_as_given():
    assert check_server_args(SAFE) == (SAFE, [])


@pytest.mark.parametrize(
    ("given", "kept"),
    [
        (["--max-model-len 2048"], ["--max-model-len", "2048"]),  # an option and its value in one item
        (["--max_model_len", "64"], ["--max-model-len", "64"]),  # vLLM reads underscores as dashes
        (["--max-model-len=64", "--enforce-eager"], ["--max-model-len=64", "--enforce-eager"]),
        (["--tool-call-parser", "hermes", "--enable-auto-tool-choice"], None),
    ],
)
def test_spellings_vllm_reads_are_kept_as_it_reads_them(given, kept):
    assert check_server_args(given) == (kept or given, [])


@pytest.mark.parametrize(
    ("given", "said"),
    [
        (["--trust-remote-code"], "--trust-remote-code is refused: it runs the model repository's Python code"),
        (["--trust_remote_code"], "--trust-remote-code is refused"),
        (["--trust-remote"], "'--trust-remote' (read by vLLM as --trust-remote-code) is refused"),
        (["--tool-parser-plugin", "/tmp/p.py"], "--tool-parser-plugin is refused: it runs Python code"),
        (["--allowed-local-media-path", "/"], "--allowed-local-media-path is refused: it serves the node's files"),
        (["--otlp-traces-endpoint", "http://x:4317"], "--otlp-traces-endpoint is refused: it sends request traces"),
        (["--middleware", "os.system"], "--middleware is refused: it runs Python code"),
        (["--worker-cls", "a.B"], "--worker-cls is refused"),
        (["--lora-modules", "a=/etc"], "--lora-modules is refused: it loads adapters from paths"),
        (["--generation-config", "/etc"], "--generation-config is refused: it reads a folder"),
        (["--tokenizer", "/etc"], "--tokenizer is refused"),
        (["--speculative-config", "{}"], "--speculative-config is refused"),
        (["--chat-template", "/etc/hostname"], "--chat-template '/etc/hostname': must be an inline Jinja template"),
        (["--chat-template=/etc/hostname"], "--chat-template '/etc/hostname': must be an inline Jinja template"),
        (["--chat-template", "hostname"], "never a file name"),
        (["--chat-template", "../{{x}}"], "never a file name"),
        (["--port", "9000"], "--port is set by the agent itself"),
        (["--some-new-flag", "1"], "--some-new-flag is not a server flag an endpoint may set"),
        (["-q", "awq"], "'-q' is not a server flag an endpoint may set"),
        (["--max-model", "1"], "--max-model is not a server flag"),  # an abbreviation is never taken
        (["--compilation-config.pass_config", "x"], "is not a server flag"),
        (["stray"], "'stray' is not a flag"),
    ],
)
def test_dangerous_or_unknown_flags_are_refused_by_name(given, said):
    kept, problems = check_server_args(given)
    assert kept == []
    assert len(problems) == 1, problems  # one message per refused flag (its value is not a second one)
    assert said in problems[0]


@pytest.mark.parametrize(
    ("given", "said"),
    [
        (["--max-model-len", "0"], "--max-model-len '0': must be an integer from 1 to 10000000"),
        (["--max-model-len", "1e3"], "must be an integer"),
        (["--max-model-len", "--trust-remote-code"], "must be an integer"),
        (["--max-num-seqs", "-1"], "must be an integer from 1 to 65536"),
        (["--gpu-memory-utilization", "1.5"], "must be a number from 0.05 to 1"),
        (["--gpu-memory-utilization", "nan"], "must be a number"),
        (["--dtype", "evil"], "--dtype 'evil': must be one of auto, half"),
        (["--block-size", "7"], "must be one of 1, 8, 16"),
        (["--tool-call-parser", "../x.py"], "a built-in parser's name"),
        (["--override-generation-config", "[1]"], "must be a JSON object of plain values"),
        (["--override-generation-config", '{"a": {"b": 1}}'], "must be a JSON object of plain values"),
        (["--enforce-eager=false"], "--enforce-eager takes no value"),
        (["--no-disable-log-stats"], "--no-disable-log-stats is not a server flag"),
        (["--max-model-len"], "--max-model-len needs a value"),
    ],
)
def test_values_are_checked_by_type_and_range(given, said):
    kept, problems = check_server_args(given)
    assert kept == []
    assert any(said in p for p in problems), problems


def test_the_agent_refuses_a_template_that_names_a_file_on_its_node(tmp_path):
    """vLLM opens the value as a file before it uses it as a template: a file's name is refused there."""
    named = tmp_path / "{{x}}"
    named.write_text("secret")
    assert check_server_args(["--chat-template", str(named)])[1]  # a path is refused on both sides
    assert check_server_args(["--chat-template", "{{x}}"]) == (["--chat-template", "{{x}}"], [])
    kept, problems = check_server_args(["--chat-template", "{{x}}"], exists=lambda v: v == "{{x}}")
    assert kept == []
    assert "names a file on this node" in problems[0]


def test_every_allowed_and_refused_flag_is_a_long_flag_and_none_is_both():
    assert not set(protocol.ENDPOINT_SERVER_FLAGS) & set(protocol.ENDPOINT_REFUSED_FLAGS)
    assert not set(protocol.ENDPOINT_SERVER_FLAGS) & set(protocol.ENDPOINT_AGENT_ARGS)
    assert all(flag.startswith("--") for flag in [*protocol.ENDPOINT_SERVER_FLAGS, *protocol.ENDPOINT_REFUSED_FLAGS])


# ---- what a replica holds


def test_on_a_gpu_node_an_endpoint_holds_at_least_one_gpu():
    assert endpoint_gpus_held(gpus=0, min_vram_mb=0, node_gpus=2) == 1
    assert endpoint_gpus_held(gpus=2, min_vram_mb=0, node_gpus=4) == 2
    assert endpoint_gpus_held(gpus=0, min_vram_mb=0, node_gpus=0) == 0  # a CPU node: none
    assert endpoint_gpus_held(gpus=0, min_vram_mb=100, node_gpus=0) == 1  # asks VRAM: it needs a GPU


def test_the_vram_held_is_vllms_share_of_the_pinned_gpus():
    node = [
        {"index": 0, "memory_total_mb": 80_000, "memory_used_mb": 70_000},
        {"index": 1, "memory_total_mb": 40_000, "memory_used_mb": 0},
    ]
    # one GPU pinned: the one with most free memory (index 1), 0.9 of its 40,000 MB
    assert endpoint_vram_held_mb(gpus=0, min_vram_mb=0, node_gpus=node) == 36_000
    assert endpoint_vram_held_mb(gpus=0, min_vram_mb=0, node_gpus=node, server_args=SAFE) == 34_000  # 0.85
    assert endpoint_vram_held_mb(gpus=2, min_vram_mb=0, node_gpus=node) == 108_000
    assert endpoint_vram_held_mb(gpus=0, min_vram_mb=39_000, node_gpus=node) == 39_000  # never less than asked
    assert endpoint_vram_held_mb(gpus=0, min_vram_mb=0, node_gpus=[]) == 0


# ---- against the real vLLM


PARSE_SCRIPT = r"""
import json, sys
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
except ImportError:  # older vLLM
    from vllm.utils import FlexibleArgumentParser
    from vllm.entrypoints.openai.cli_args import make_arg_parser
parser = make_arg_parser(FlexibleArgumentParser())
known = sorted({o for a in parser._actions for o in a.option_strings})
refused = []
for args in json.loads(sys.stdin.read()):
    try:
        parser.parse_args(["--model", "m", *args])
    except SystemExit:
        refused.append(args)
print(json.dumps({"known": known, "refused": refused}))
"""
# Allowed for the vLLM builds GPU nodes run that still know it; the CPU build here (0.32) dropped it.
NOT_IN_NEWEST_VLLM = {"--swap-space"}


def _samples(flag: str, spec: protocol.ServerFlag) -> list[list[str]]:
    if spec.kind == "switch":
        return [[flag]] + ([[f"--no-{flag[2:]}"]] if spec.negatable else [])
    if spec.kind == "choice":
        return [[flag, choice] for choice in spec.choices]
    if spec.kind == "int":
        return [[flag, str(int(spec.low or 1))], [flag, str(int(spec.high))]]
    if spec.kind == "float":
        return [[flag, str(max(spec.low, 0.05))], [flag, str(spec.high)]]
    sample = {"name": "hermes", "json": '{"temperature": 0.5}', "template": "{{ messages }}"}[spec.kind]
    return [[flag, sample]]


def test_every_allowed_flag_and_value_is_one_the_real_vllm_parser_takes():
    """The allow-list names vLLM's real flags (as the CPU build here spells them), and every value it lets
    through parses; every flag refused by name is one vLLM knows (so the reason names a real danger)."""
    import json
    import subprocess

    from tests.support.tiny_llm import vllm_python

    python = vllm_python()
    if not python:
        missing("vLLM's CPU engine", "not built here (bash .ci/vllm-venv builds it)")
    samples = [
        args
        for flag, spec in protocol.ENDPOINT_SERVER_FLAGS.items()
        if flag not in NOT_IN_NEWEST_VLLM
        for args in _samples(flag, spec)
    ]
    for args in samples:
        assert check_server_args(args) == (args, []), args
    done = subprocess.run(
        [python, "-c", PARSE_SCRIPT], input=json.dumps(samples), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    known = set(answer["known"])
    assert set(protocol.ENDPOINT_SERVER_FLAGS) - NOT_IN_NEWEST_VLLM <= known
    assert set(protocol.ENDPOINT_REFUSED_FLAGS) <= known
    assert answer["refused"] == []

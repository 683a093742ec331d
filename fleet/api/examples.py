"""Request examples of POST /clusters/{id}/commands, one per command type (the API docs show them;
tests/fleet/test_api_schema.py checks that each is accepted as it stands)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiExample

MODEL = "Qwen/Qwen2.5-0.5B-Instruct"

COMMAND_EXAMPLES: dict[str, dict[str, Any]] = {
    "container.create": {
        "image": "docker.io/library/nginx:1.27",
        "name": "web",
        "ports": [{"container_port": 80, "host_port": 8080, "protocol": "tcp"}],
        "env": {"GREETING": "hello"},
        "cpu": 1.5,
        "memory_mb": 512,
        "start": True,
    },
    "container.start": {"container": "web"},
    "container.stop": {"container": "web", "timeout_s": 10},
    "container.destroy": {"container": "web"},
    "model.download": {"model_id": MODEL, "revision": "main", "allow_patterns": ["*.json", "*.safetensors"]},
    "model.evict": {"model_id": MODEL, "revision": "main"},
    "endpoint.start": {"model_id": MODEL, "port": 8000, "gpus": 1},
    "endpoint.stop": {"endpoint_id": "3f9a1c2b7d4e"},
    "endpoint.adapter.load": {
        "endpoint_id": "3f9a1c2b7d4e",
        "adapter": {"name": "support-tone", "model_id": "acme/support-tone-lora", "revision": "main"},
    },
    "endpoint.adapter.unload": {"endpoint_id": "3f9a1c2b7d4e", "name": "support-tone"},
}


def command_examples() -> list[OpenApiExample]:
    """One request example per command type, sent to every online node (`node_id` null)."""
    return [
        OpenApiExample(
            command_type,
            value={"command_type": command_type, "node_id": None, "payload": payload},
            request_only=True,
        )
        for command_type, payload in COMMAND_EXAMPLES.items()
    ]

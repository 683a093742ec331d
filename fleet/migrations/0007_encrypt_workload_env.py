"""Move the env values already stored in plain text into the encrypted `Command.secrets`.

Commands keep `env` (and a Ray job's `runtime_env.env_vars`) with their keys and a mask; the values
join the command's encrypted secrets, from which `Command.wire_payload()` merges them back for the
agent. Containers keep their create payload as `spec`: its env values are masked too. Self-contained
(it does not import `fleet.payloads`, which may change after this migration).
"""

from __future__ import annotations

import json
from typing import Any

from django.db import migrations
from django.db.models import Q

MASK = "••••••"


def _secret_mapping(payload: dict[str, Any]) -> list[tuple[str, dict[str, Any], list[str]]]:
    """(top-level field, its original value, path inside it) for each unmasked secret mapping."""
    found = []
    env = payload.get("env")
    if isinstance(env, dict) and env and set(env.values()) != {MASK}:
        found.append(("env", env, []))
    runtime_env = payload.get("runtime_env")
    env_vars = runtime_env.get("env_vars") if isinstance(runtime_env, dict) else None
    if isinstance(env_vars, dict) and env_vars and set(env_vars.values()) != {MASK}:
        found.append(("runtime_env", runtime_env, ["env_vars"]))
    return found


def _masked(payload: dict[str, Any]) -> dict[str, Any]:
    public = dict(payload)
    for head, value, rest in _secret_mapping(payload):
        if rest:
            public[head] = {**value, rest[0]: {k: MASK for k in value[rest[0]]}}
        else:
            public[head] = {k: MASK for k in value}
    return public


def encrypt_env(apps: Any, schema_editor: Any) -> None:
    Command = apps.get_model("fleet", "Command")
    Container = apps.get_model("fleet", "Container")
    has_env = Q(payload__has_key="env") | Q(payload__runtime_env__has_key="env_vars")
    for command in Command.objects.filter(has_env).iterator(chunk_size=500):
        found = _secret_mapping(command.payload or {})
        if not found:
            continue
        secrets = json.loads(command.secrets) if command.secrets else {}
        for head, value, _ in found:
            secrets.setdefault(head, value)
        command.secrets = json.dumps(secrets)
        command.payload = _masked(command.payload)
        command.save(update_fields=["payload", "secrets"])
    for container in Container.objects.filter(spec__has_key="env").iterator(chunk_size=500):
        spec = _masked(container.spec or {})
        if spec != container.spec:
            container.spec = spec
            container.save(update_fields=["spec"])


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0006_tunnel_inbox"),
    ]

    operations = [migrations.RunPython(encrypt_env, migrations.RunPython.noop)]

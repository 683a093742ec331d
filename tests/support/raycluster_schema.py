"""The part of KubeRay's RayCluster (ray.io/v1) schema that our manifests use, written here by hand.

It follows the field names, types and shapes of the ray.io/v1 CRD (``RayClusterSpec``,
``HeadGroupSpec``, ``WorkerGroupSpec``, ``AutoscalerOptions``, and the core/v1 ``PodTemplateSpec``
fields we set). It is strict where our manifests write (an unknown or misspelt field under ``spec`` is a
problem, as the CRD's structural schema would prune or refuse it) and checks only what we use; no
third-party schema file is copied in. `problems(manifest)` lists what is wrong ('' paths are the root).
"""

from __future__ import annotations

import re
from typing import Any

_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_QUANTITY = r"^([0-9]+(\.[0-9]+)?)(m|Ki|Mi|Gi|Ti|k|M|G|T)?$"

STR = {"type": "string"}
INT = {"type": "integer"}
BOOL = {"type": "boolean"}
STR_MAP = {"type": "map", "values": STR}
QUANTITIES = {"type": "map", "values": {"type": "string", "pattern": _QUANTITY}}


def obj(properties: dict[str, Any], *, required: tuple[str, ...] = (), strict: bool = True) -> dict[str, Any]:
    """An object schema node."""
    return {"type": "object", "properties": properties, "required": required, "strict": strict}


PORT = obj(
    {
        "name": {"type": "string", "pattern": r"^[a-z0-9-]{1,15}$"},
        "containerPort": {"type": "integer", "min": 1, "max": 65535},
    },
    required=("containerPort",),
)
CONTAINER = obj(
    {
        "name": {"type": "string", "pattern": _DNS_LABEL},
        "image": {"type": "string", "pattern": r"^\S+$"},
        "ports": {"type": "array", "items": PORT},
        "resources": obj({"requests": QUANTITIES, "limits": QUANTITIES}),
        "lifecycle": obj({"preStop": obj({"exec": obj({"command": {"type": "array", "items": STR}})})}),
    },
    required=("name", "image"),
)
POD_TEMPLATE = obj(
    {
        "metadata": obj({"labels": STR_MAP, "annotations": STR_MAP}),
        "spec": obj({"containers": {"type": "array", "items": CONTAINER, "min_items": 1}}, required=("containers",)),
    },
    required=("spec",),
)
HEAD_GROUP = obj(
    {
        "serviceType": {"type": "string", "enum": ("ClusterIP", "NodePort", "LoadBalancer")},
        "rayStartParams": STR_MAP,
        "template": POD_TEMPLATE,
    },
    required=("template",),
)
WORKER_GROUP = obj(
    {
        "groupName": {"type": "string", "pattern": _DNS_LABEL},
        "replicas": {"type": "integer", "min": 0},
        "minReplicas": {"type": "integer", "min": 0},
        "maxReplicas": {"type": "integer", "min": 0},
        "rayStartParams": STR_MAP,
        "template": POD_TEMPLATE,
    },
    required=("groupName", "maxReplicas", "template"),
)
SPEC = obj(
    {
        "rayVersion": {"type": "string", "pattern": r"^[0-9]+\.[0-9]+\.[0-9]+$"},
        "suspend": BOOL,
        "enableInTreeAutoscaling": BOOL,
        "autoscalerOptions": obj(
            {
                "idleTimeoutSeconds": {"type": "integer", "min": 0},
                "upscalingMode": {"type": "string", "enum": ("Default", "Aggressive", "Conservative")},
            }
        ),
        "headGroupSpec": HEAD_GROUP,
        "workerGroupSpecs": {"type": "array", "items": WORKER_GROUP},
    },
    required=("headGroupSpec",),
)
RAYCLUSTER = obj(
    {
        "apiVersion": {"type": "string", "enum": ("ray.io/v1",)},
        "kind": {"type": "string", "enum": ("RayCluster",)},
        "metadata": obj(
            {
                "name": {"type": "string", "pattern": _DNS_LABEL},
                "namespace": STR,
                "labels": STR_MAP,
                "annotations": STR_MAP,
            },
            required=("name",),
            strict=False,  # the API server adds uid, resourceVersion, …
        ),
        "spec": SPEC,
        "status": {"type": "any"},
    },
    required=("apiVersion", "kind", "metadata", "spec"),
)


def _check(value: Any, schema: dict[str, Any], path: str, out: list[str]) -> None:
    kind = schema["type"]
    if kind == "any":
        return
    if kind == "object":
        if not isinstance(value, dict):
            out.append(f"{path or '.'}: expected an object")
            return
        props = schema["properties"]
        out.extend(f"{path}.{name}: required" for name in schema["required"] if name not in value)
        for name, item in value.items():
            if name in props:
                _check(item, props[name], f"{path}.{name}", out)
            elif schema["strict"]:
                out.append(f"{path}.{name}: unknown field")
    elif kind == "map":
        if not isinstance(value, dict):
            out.append(f"{path}: expected a map")
            return
        for key, item in value.items():
            _check(item, schema["values"], f"{path}[{key}]", out)
    elif kind == "array":
        if not isinstance(value, list):
            out.append(f"{path}: expected a list")
            return
        if len(value) < schema.get("min_items", 0):
            out.append(f"{path}: at least {schema['min_items']} item(s)")
        for index, item in enumerate(value):
            _check(item, schema["items"], f"{path}[{index}]", out)
    elif kind == "string":
        if not isinstance(value, str):
            out.append(f"{path}: expected a string")
        elif "pattern" in schema and not re.match(schema["pattern"], value):
            out.append(f"{path}: {value!r} does not match {schema['pattern']}")
        elif "enum" in schema and value not in schema["enum"]:
            out.append(f"{path}: {value!r} is not one of {', '.join(schema['enum'])}")
    elif kind == "integer":
        if isinstance(value, bool) or not isinstance(value, int):
            out.append(f"{path}: expected an integer")
        elif value < schema.get("min", value) or value > schema.get("max", value):
            out.append(f"{path}: {value} out of range")
    elif kind == "boolean" and not isinstance(value, bool):
        out.append(f"{path}: expected true or false")


def problems(manifest: Any) -> list[str]:
    """Everything in `manifest` the RayCluster schema refuses, plus KubeRay's own rule min ≤ max replicas."""
    out: list[str] = []
    _check(manifest, RAYCLUSTER, "", out)
    if not out:
        for index, group in enumerate(manifest["spec"].get("workerGroupSpecs") or []):
            if group.get("minReplicas", 0) > group["maxReplicas"]:
                out.append(f".spec.workerGroupSpecs[{index}]: minReplicas above maxReplicas")
    return out

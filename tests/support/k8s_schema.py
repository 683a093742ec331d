"""The official Kubernetes object schemas (kubernetes-validate's copy, strict: unknown fields fail).

`problems(obj)` lists what the API server's validation would refuse in an object's shape: unknown
fields, wrong types, missing required fields. The schemas are those `kubernetes_validate.validate(…,
strict=True)` uses, loaded once per kind (that call reads the 1.8 MB definitions file every time, which
the kube stand-in, validating every object it receives, cannot afford).
"""

from __future__ import annotations

import json
import re
from functools import cache
from importlib.resources import files
from typing import Any

import jsonschema
import kubernetes_validate
from referencing import Registry, Resource

KUBERNETES_VERSION = "1.37"


class UnknownKind(LookupError):
    """No official schema for this apiVersion and kind."""


def _schema_dir(version: str) -> Any:
    full = next(v for v in reversed(kubernetes_validate.utils.all_versions()) if v.startswith(version + "."))
    return files("kubernetes_validate").joinpath("kubernetes-json-schema", f"v{full}-local-strict")


@cache
def _definitions(version: str) -> Resource:
    return Resource.from_contents(json.loads(_schema_dir(version).joinpath("_definitions.json").read_text()))


@cache
def validator(api_version: str, kind: str, version: str = KUBERNETES_VERSION) -> jsonschema.protocols.Validator:
    """A strict validator for one kind (`apps/v1`, `Deployment`), as kubernetes-validate builds it."""
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    path = _schema_dir(version).joinpath(f"{kind.lower()}-{group_version}.json")
    if not path.is_file():
        raise UnknownKind(f"no schema for {api_version} {kind} in Kubernetes {version}")
    schema = json.loads(path.read_text())
    registry = _definitions(version) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)


def problems(obj: dict[str, Any], version: str = KUBERNETES_VERSION) -> list[str]:
    """What the official schema refuses in obj (empty when valid), each as `path: message`."""
    if not isinstance(obj, dict) or not obj.get("apiVersion") or not obj.get("kind"):
        return ["the object needs apiVersion and kind"]
    check = validator(obj["apiVersion"], obj["kind"], version)
    found = []
    for error in sorted(check.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path))):
        where = ".".join(str(part) for part in error.absolute_path) or "(root)"
        found.append(f"{where}: {error.message}")
    return found

"""Writes of the model catalog: importing (and refreshing) the curated file, a workspace's private models."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction

from agent.protocol import LOCAL_PATH_RE
from fleet.workloads.catalog import CatalogError, load_catalog, parse_entry
from fleet.workloads.models import CatalogModel
from tenancy.mixins import require_operator
from tenancy.models import Workspace

_SPEC_FIELDS = ("params_b", "context_length", "layers", "kv_heads", "head_dim", "attention_heads")


def _quantizations(entry_spec: Any) -> list[dict[str, Any]]:
    return [
        {"name": q.name, "bytes_per_param": q.bytes_per_param, "model_id": q.model_id} for q in entry_spec.quantizations
    ]


def catalog_import(*, path: Path | None = None) -> dict[str, int]:
    """Make the curated rows exactly the catalog file's models (by name): created, updated, removed; the file
    is checked whole first (CatalogError, nothing written). Workspaces' private models are left alone."""
    version, entries = load_catalog(path)
    with transaction.atomic():
        rows = {r.name: r for r in CatalogModel.objects.select_for_update().filter(workspace__isnull=True)}
        created = updated = 0
        for entry in entries:
            values = {
                "model_id": entry.model_id,
                "revision": entry.revision,
                "local_path": "",
                "description": entry.description,
                "quantizations": _quantizations(entry.spec),
                "server_args": entry.server_args,
                "tags": entry.tags,
                "catalog_version": version,
                **{name: getattr(entry.spec, name) for name in _SPEC_FIELDS},
            }
            row = rows.get(entry.name)
            if row is None:
                CatalogModel.objects.create(workspace=None, name=entry.name, **values)
                created += 1
            elif any(getattr(row, k) != v for k, v in values.items()):
                for k, v in values.items():
                    setattr(row, k, v)
                row.save()
                updated += 1
        gone = [r.pk for name, r in rows.items() if name not in {e.name for e in entries}]
        CatalogModel.objects.filter(pk__in=gone).delete()
    return {"version": version, "created": created, "updated": updated, "removed": len(gone)}


def catalog_private_create(*, actor: AbstractBaseUser, workspace: Workspace, values: dict[str, Any]) -> CatalogModel:
    """A private model of `workspace` (Owner/Admin): a Hub `model_id` and `revision`, or a `local_path` on the
    nodes, with its sizes; ValidationError with field messages on bad input."""
    require_operator(actor, workspace, what="add models to the catalog")
    local_path = str(values.get("local_path") or "")
    problems: dict[str, str] = {}
    if local_path and (not re.fullmatch(LOCAL_PATH_RE, local_path) or len(local_path) > 1000):
        problems["local_path"] = "An absolute folder path on the nodes (no '..'), at most 1000 characters."
    item = {k: v for k, v in values.items() if k not in ("local_path", "workspace") and v not in (None, "")}
    if local_path and not item.get("model_id"):
        item["model_id"] = "local/" + (local_path.rstrip("/").rsplit("/", 1)[-1] or "model")[:90]
    try:
        entry = parse_entry(item)
    except CatalogError as exc:
        problems.update({k: v for k, v in exc.problems.items() if k})
        entry = None
    if entry is not None and CatalogModel.objects.filter(workspace=workspace, name=entry.name).exists():
        problems["name"] = "This workspace already has a model of that name."
    if problems or entry is None:
        raise ValidationError(problems or {"name": "Invalid model."})
    return CatalogModel.objects.create(
        workspace=workspace,
        name=entry.name,
        model_id=entry.model_id,  # a local folder's: local/<folder name>, the name its nodes register it under
        revision=entry.revision,
        local_path=local_path,
        description=entry.description,
        quantizations=_quantizations(entry.spec),
        server_args=entry.server_args,
        tags=entry.tags,
        created_by=actor,
        **{name: getattr(entry.spec, name) for name in _SPEC_FIELDS},
    )


def catalog_private_delete(*, actor: AbstractBaseUser, model: CatalogModel) -> None:
    """Remove a workspace's private model (Owner/Admin); curated models change only with the file."""
    if model.workspace is None:
        raise ValidationError({"model": "Curated models change only with the repository's catalog file."})
    require_operator(actor, model.workspace, what="remove models from the catalog")
    model.delete()

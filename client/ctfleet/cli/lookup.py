"""Finding what a verb names: a resource by its name, objects by id or name, a workspace, rows and columns."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ctfleet import errors
from ctfleet.cli.base import state
from ctfleet.resources import RESOURCES, Resource, is_uuid, resource


def resource_named(name: str) -> Resource:
    """The resource called `name` (singular, plural or short); `InvalidInput` naming them all if none."""
    found = resource(name)
    if found is None:
        raise errors.InvalidInput(
            f"Unknown resource {name!r}.", hint=f"One of: {', '.join(r.name for r in RESOURCES)}."
        )
    return found


def workspace_row(ref: str | None) -> dict[str, Any]:
    """The workspace `ref` names (id, slug or name), or the only one the key reaches."""
    from ctfleet.manifests import Resolver

    return Resolver(state().client).workspace(ref)


def parse_filters(pairs: tuple[str, ...], res: Resource) -> dict[str, str]:
    """`-l KEY=VALUE` filters as API query parameters."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise errors.InvalidInput(
                f"Filter {pair!r} is not key=value.", hint=f"Filters of {res.name}: {res.filters}"
            )
        out[key] = value
    return out


def list_rows(res: Resource, filters: dict[str, str]) -> Iterator[dict[str, Any]]:
    """Rows of a resource as printed (quotas and usage flattened into lines)."""
    client = state().client
    if res.name == "quotas":
        for ws in [workspace_row(state().workspace)] if state().workspace else client.paginate("api/v1/workspaces/"):
            body = client.get(f"api/v1/workspaces/{ws['id']}/quotas/")
            for line in body["quotas"]:
                yield {"workspace": ws["slug"], **line}
        return
    if res.name == "usage":
        body = client.get(res.path, **filters)
        yield from body["subjects"]
        return
    if state().workspace and res.name in ("clusters",) and "workspace" not in filters:
        filters = {**filters, "workspace": workspace_row(state().workspace)["id"]}
    yield from client.paginate(res.path, filters)


def find(res: Resource, ref: str) -> dict[str, Any]:
    """One object by id, or by name (slug for endpoints)."""
    client = state().client
    if res.name in ("quotas", "usage"):
        raise errors.InvalidInput(f"Use `ctfleet get {res.name}` for {res.name}.")
    if is_uuid(ref) or (res.name == "apikeys" and ref.isdigit()):
        return client.get(f"{res.path}{ref}/")
    params = {"q": ref} if "q" in res.filters else {}
    matches = [row for row in client.paginate(res.path, params) if row.get(res.name_field) == ref]
    if not matches:
        raise errors.NotFound(404, {"detail": f"No {res.name[:-1] if res.name.endswith('s') else res.name} {ref!r}."})
    if len(matches) > 1:
        ids = ", ".join(m["id"] for m in matches)
        raise errors.InvalidInput(f"{len(matches)} {res.name} are called {ref!r}: name one by id ({ids}).")
    return matches[0]


def columns_for(res: Resource, output: str) -> list[str]:
    """The columns `res` prints in `output` (``wide`` adds its wide ones)."""
    return [*res.columns, *(res.wide if output == "wide" else ())]

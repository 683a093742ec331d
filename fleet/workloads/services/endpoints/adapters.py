"""LoRA adapters of a workspace and the endpoints they are attached to (Owner, Admin, Member).

An adapter is a workspace's object (`LoraAdapter`: a Hub repository at a revision, or a directory on the nodes).
Attached to an endpoint whose servers run with `--enable-lora`, every replica loads it without a restart: one
`endpoint.adapter.load` per running replica now, and each replica started later carries the endpoint's adapters
in its `endpoint.start`. Detaching unloads it the same way. Each replica's loaded adapters are kept from what its
commands report (`EndpointReplica.adapters`), and the proxy routes a request naming an adapter to a replica that
holds it. Quotas are unchanged: an adapter holds no GPU of its own.
"""

from __future__ import annotations

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction

from agent import protocol
from audit.services import created, new, on, operator_action
from fleet.models import Command, CommandStatus, CommandType
from fleet.services import command_queue
from fleet.workloads.errors import error_sentence
from fleet.workloads.models import Endpoint, EndpointAdapter, EndpointReplica, EndpointStatus, LoraAdapter
from fleet.workloads.services.endpoints.events import endpoint_event_record
from fleet.workloads.services.endpoints.replicas import endpoint_adapter_refs
from kernel.exceptions import IllegalTransition
from tenancy.mixins import require_editor
from tenancy.models import Workspace

ENABLE_LORA = "--enable-lora"


def _validate_ref(name: str, model_id: str, revision: str, path: str) -> protocol.LoraAdapterRef:
    """The adapter as the protocol carries it; ValidationError with field messages when it cannot be one."""
    if bool(model_id) == bool(path):
        raise ValidationError({"model_id": "Give either a Hub repository (model_id, revision) or a path on the nodes."})
    try:
        return protocol.from_dict(
            protocol.LoraAdapterRef,
            {"name": name, "model_id": model_id, "revision": revision or "main", "path": path},
            where="adapter",
        )
    except protocol.ProtocolError as exc:
        field = next((f for f in ("name", "model_id", "revision", "path") if f in str(exc)), "name")
        raise ValidationError({field: str(exc)}) from None


@operator_action("adapter.create", target=new("adapter", name="name", within="workspace"), result=created("adapter"))
def lora_adapter_create(
    *,
    actor: AbstractBaseUser,
    workspace: Workspace,
    name: str,
    model_id: str = "",
    revision: str = "main",
    path: str = "",
) -> LoraAdapter:
    """Add a LoRA adapter to `workspace`: a Hub repository (`model_id`@`revision`) or an absolute `path` on the
    nodes; its `name` (unique in the workspace) is the `model` requests name it by."""
    require_editor(actor, workspace, what="add LoRA adapters")
    ref = _validate_ref(name, model_id, revision, path)
    if LoraAdapter.objects.filter(workspace=workspace, name=ref.name).exists():
        raise ValidationError({"name": f"This workspace has an adapter named {ref.name} already."})
    return LoraAdapter.objects.create(
        workspace=workspace,
        name=ref.name,
        model_id=ref.model_id,
        revision=ref.revision,
        path=ref.path,
        created_by=actor,
    )


@operator_action("adapter.delete", target=on("adapter", "adapter"))
def lora_adapter_delete(*, actor: AbstractBaseUser, adapter: LoraAdapter) -> None:
    """Delete an adapter attached to no endpoint (IllegalTransition, 409, while one uses it)."""
    require_editor(actor, adapter.workspace, what="delete LoRA adapters")
    with transaction.atomic():
        used = list(Endpoint.objects.filter(adapter_links__adapter=adapter).values_list("slug", flat=True))
        if used:
            raise IllegalTransition(f"Adapter {adapter.name} is attached to endpoint(s) {', '.join(used)}: detach it.")
        adapter.delete()


def _queue(*, actor: AbstractBaseUser | None, endpoint: Endpoint, replica: EndpointReplica, payload: object) -> Command:
    command_type = (
        CommandType.ENDPOINT_ADAPTER_LOAD
        if isinstance(payload, protocol.EndpointAdapterLoadPayload)
        else CommandType.ENDPOINT_ADAPTER_UNLOAD
    )
    (command,) = command_queue(
        actor=actor,
        cluster=endpoint.cluster,
        command_type=command_type,
        payload=payload,
        node=replica.node,
        as_workload=True,
    )
    return command


def replica_sync_adapters(
    *, actor: AbstractBaseUser | None, endpoint: Endpoint, replica: EndpointReplica
) -> list[Command]:
    """Queue the loads and unloads that bring a running replica's adapters to the endpoint's attached ones."""
    if replica.status != EndpointStatus.RUNNING or replica.node_id is None:
        return []
    wanted = {ref.name: ref for ref in endpoint_adapter_refs(endpoint)}
    held = set(replica.adapters or [])
    commands = [
        _queue(
            actor=actor,
            endpoint=endpoint,
            replica=replica,
            payload=protocol.EndpointAdapterLoadPayload(endpoint_id=replica.server_id, adapter=ref),
        )
        for name, ref in sorted(wanted.items())
        if name not in held
    ]
    commands += [
        _queue(
            actor=actor,
            endpoint=endpoint,
            replica=replica,
            payload=protocol.EndpointAdapterUnloadPayload(endpoint_id=replica.server_id, name=name),
        )
        for name in sorted(held - set(wanted))
    ]
    return commands


def _sync_running(*, actor: AbstractBaseUser, endpoint: Endpoint) -> int:
    replicas = EndpointReplica.objects.select_for_update().filter(
        endpoint=endpoint, status=EndpointStatus.RUNNING, retired_at__isnull=True
    )
    return sum(len(replica_sync_adapters(actor=actor, endpoint=endpoint, replica=r)) for r in replicas)


@operator_action("endpoint.adapter.attach", target=on("endpoint", "endpoint"))
def endpoint_adapter_attach(*, actor: AbstractBaseUser, endpoint: Endpoint, adapter: LoraAdapter) -> Endpoint:
    """Attach `adapter` to `endpoint`: its running replicas load it now, later ones as they start. The endpoint's
    servers must run with `--enable-lora` (IllegalTransition, 409, saying how otherwise)."""
    require_editor(actor, endpoint.cluster.workspace, what="attach LoRA adapters")
    if adapter.workspace_id != endpoint.cluster.workspace_id:
        raise ValidationError({"adapter": "No such adapter in this endpoint's workspace."})
    with transaction.atomic():
        endpoint = Endpoint.objects.select_for_update().get(pk=endpoint.pk)
        if ENABLE_LORA not in endpoint.server_args:
            raise IllegalTransition(
                f"Endpoint {endpoint.slug} serves without LoRA: add {ENABLE_LORA} to its server arguments (a rolling "
                "update, no downtime), then attach the adapter."
            )
        _, created = EndpointAdapter.objects.get_or_create(endpoint=endpoint, adapter=adapter)
        if created:
            loads = _sync_running(actor=actor, endpoint=endpoint)
            endpoint_event_record(
                endpoint=endpoint,
                kind="endpoint.adapter_attached",
                message=f"Adapter {adapter.name} ({adapter.source}) attached by {actor.get_username()}: "
                f"loading on {loads} running replica(s)",
                data={"adapter": adapter.name},
            )
    return endpoint


@operator_action("endpoint.adapter.detach", target=on("endpoint", "endpoint"))
def endpoint_adapter_detach(*, actor: AbstractBaseUser, endpoint: Endpoint, adapter: LoraAdapter) -> Endpoint:
    """Detach `adapter` from `endpoint`: its running replicas unload it (requests naming it get vLLM's 404)."""
    require_editor(actor, endpoint.cluster.workspace, what="detach LoRA adapters")
    with transaction.atomic():
        endpoint = Endpoint.objects.select_for_update().get(pk=endpoint.pk)
        deleted, _ = EndpointAdapter.objects.filter(endpoint=endpoint, adapter=adapter).delete()
        if deleted:
            unloads = _sync_running(actor=actor, endpoint=endpoint)
            endpoint_event_record(
                endpoint=endpoint,
                kind="endpoint.adapter_detached",
                message=f"Adapter {adapter.name} detached by {actor.get_username()}: unloading on {unloads} replica(s)",
                data={"adapter": adapter.name},
            )
    return endpoint


def endpoint_record_adapter_outcome(*, command: Command) -> Endpoint | None:
    """An endpoint.adapter.load / unload finished: the replica's adapters are what the agent reported, and the
    endpoint's log says so (or why it failed)."""
    if command.command_type not in (CommandType.ENDPOINT_ADAPTER_LOAD, CommandType.ENDPOINT_ADAPTER_UNLOAD):
        return None
    payload = command.parsed_payload
    server_id = getattr(payload, "endpoint_id", "")
    found = EndpointReplica.objects.filter(server_id=server_id, endpoint__cluster_id=command.cluster_id).first()
    if found is None:
        return None
    loading = command.command_type == CommandType.ENDPOINT_ADAPTER_LOAD
    name = payload.adapter.name if loading else payload.name
    with transaction.atomic():
        endpoint = Endpoint.objects.select_for_update().get(pk=found.endpoint_id)
        replica = EndpointReplica.objects.select_for_update().get(pk=found.pk)
        if command.status == CommandStatus.SUCCEEDED:
            result: protocol.EndpointAdapterResult = command.parsed_result
            # this adapter's change alone: outcomes of loads running side by side may be recorded in any order
            replica.adapters = sorted({*replica.adapters, name} if loading else set(replica.adapters) - {name})
            replica.save(update_fields=["adapters", "updated_at"])
            verb = "loaded" if loading else "unloaded"
            endpoint_event_record(
                endpoint=endpoint,
                node_id=command.node_id,
                kind=f"endpoint.adapter_{verb}",
                message=f"Adapter {name} {verb} on replica {replica.server_id} in {float(result.seconds):.1f} s",
                data={"adapter": name, "seconds": result.seconds},
                command=command,
            )
        else:
            endpoint_event_record(
                endpoint=endpoint,
                node_id=command.node_id,
                kind="endpoint.adapter_failed",
                message=f"Adapter {name} could not be {'loaded' if loading else 'unloaded'} on replica "
                f"{replica.server_id}: {error_sentence(command.error_code, command.error_message)}",
                data={"adapter": name},
                command=command,
            )
    return endpoint

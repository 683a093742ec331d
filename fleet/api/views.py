"""Fleet API: clusters, join tokens, nodes, commands, node events, namespaces, agent registration.

Views are thin: they parse input with serializers, call services and map service errors to HTTP
(ValidationError → 400 with field messages, PermissionDenied → 403, IllegalTransition → 409).
Every queryset goes through `WorkspaceScopedMixin`, so other workspaces' rows are 404.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import (
    OpenApiResponse,
    PolymorphicProxySerializer,
    extend_schema,
    extend_schema_view,
    inline_serializer,
)
from rest_framework import exceptions, mixins, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from agent import protocol
from fleet import agent_updates, agent_views, ca, selectors, services
from fleet.api import serializers as s
from fleet.api.examples import command_examples
from fleet.exceptions import JoinTokenRejected
from fleet.filters import CLUSTER_FILTERS, COMMAND_FILTERS, NAMESPACE_FILTERS, NODE_FILTERS
from fleet.models import Command, ComputeCluster, Namespace, Node
from kernel.api import ServiceErrorsMixin as BaseServiceErrorsMixin
from kernel.api import validated
from kernel.filters import FilterSet
from kernel.schema import PAGING, filter_parameters, page_of
from kernel.throttling import SettingsRateThrottle
from tenancy.mixins import WorkspaceScopedMixin


class ServiceErrorsMixin(BaseServiceErrorsMixin):
    """The shared translation, plus a refused join token → 403 with its reason code."""

    def translate_exception(self, exc: Exception) -> Exception | Response:
        if isinstance(exc, JoinTokenRejected):
            return exceptions.PermissionDenied({"detail": exc.message, "code": exc.code})
        return super().translate_exception(exc)


class FilteredMixin:
    """Apply the shared filterset to list requests."""

    filterset: FilterSet | None = None
    request: Request
    action: str

    def filter_queryset(self, queryset: QuerySet) -> QuerySet:
        queryset = super().filter_queryset(queryset)  # type: ignore[misc]
        if self.filterset is not None and self.action == "list":
            queryset = self.filterset.apply(queryset, self.request.query_params)
        return queryset


COMMAND_DISPATCH = PolymorphicProxySerializer(
    component_name="CommandDispatch",
    serializers=s.command_bodies,
    resource_type_field_name="command_type",
)


@extend_schema_view(
    create=extend_schema(request=s.ClusterCreateSerializer, responses={201: s.ClusterSerializer}),
    update=extend_schema(request=s.ClusterUpdateSerializer, responses={200: s.ClusterSerializer}),
    partial_update=extend_schema(request=s.ClusterUpdateSerializer, responses={200: s.ClusterSerializer}),
)
class ClusterViewSet(ServiceErrorsMixin, FilteredMixin, WorkspaceScopedMixin, viewsets.ModelViewSet):
    """Compute clusters of the caller's workspaces; writes for Owners/Admins."""

    serializer_class = s.ClusterSerializer
    queryset = ComputeCluster.objects.all()
    filterset = CLUSTER_FILTERS

    def get_base_queryset(self) -> QuerySet[ComputeCluster]:
        return selectors.cluster_base()

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        data = validated(s.ClusterCreateSerializer, request.data)
        workspace = self.get_workspace_from_request(data.pop("workspace"))
        cluster = services.cluster_create(actor=request.user, workspace=workspace, **data)
        return Response(s.ClusterSerializer(self.get_queryset().get(pk=cluster.pk)).data, status=201)

    def update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        cluster = self.get_object()
        partial = kwargs.get("partial", False)
        data = validated(s.ClusterUpdateSerializer, request.data, partial=partial)
        auto_update = data.pop("auto_update_agents", None)
        if auto_update is not None:
            agent_updates.cluster_set_auto_update(actor=request.user, cluster=cluster, enabled=auto_update)
        if data:
            services.cluster_update(actor=request.user, cluster=cluster, **data)
        return Response(s.ClusterSerializer(self.get_queryset().get(pk=cluster.pk)).data)

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        services.cluster_delete(actor=request.user, cluster=self.get_object())
        return Response(status=204)

    @extend_schema(request=None, responses={201: s.JoinTokenSerializer})
    @action(detail=True, methods=["post"], url_path="join-tokens", serializer_class=s.JoinTokenSerializer)
    def join_tokens(self, request: Request, pk: str | None = None) -> Response:
        """Mint a single-use join token; the raw token is in this answer only."""
        token, raw = services.join_token_create(cluster=self.get_object(), actor=request.user)
        body = {
            "id": token.pk,
            "token": raw,
            "join_command": services.join_command(raw, agent_views.control_plane_url(request)),
            "expires_at": token.expires_at,
        }
        return Response(s.JoinTokenSerializer(body).data, status=201, headers={"Cache-Control": "no-store"})

    @extend_schema(request=None, responses={200: s.ClusterSerializer})
    @action(detail=True, methods=["post"], url_path="resume-automation", serializer_class=s.ClusterSerializer)
    def resume_automation(self, request: Request, pk: str | None = None) -> Response:
        """End a partition pause now (Owner/Admin): automatic drains and rescheduling run again."""
        cluster = services.cluster_resume_automation(actor=request.user, cluster=self.get_object())
        return Response(s.ClusterSerializer(self.get_queryset().get(pk=cluster.pk)).data)

    @extend_schema(
        request=None,
        responses={
            202: OpenApiResponse(
                inline_serializer("AgentUpdates", {"commands": s.CommandSerializer(many=True)}),
                description="Queued: one `agent.update` command per node whose agent is not the served version.",
            )
        },
    )
    @action(detail=True, methods=["post"], url_path="update-agents", serializer_class=s.CommandSerializer)
    def update_agents(self, request: Request, pk: str | None = None) -> Response:
        """Update the agent of every node not on the served version (Owner/Admin); 202 with the commands."""
        created = agent_updates.cluster_update_agents(actor=request.user, cluster=self.get_object())
        return Response({"commands": s.CommandSerializer(created, many=True).data}, status=202)

    @extend_schema(
        methods=["GET"],
        parameters=[*filter_parameters(COMMAND_FILTERS), *PAGING],
        responses={200: page_of(s.CommandSerializer)},
    )
    @extend_schema(
        methods=["POST"],
        request=COMMAND_DISPATCH,
        responses={
            202: OpenApiResponse(s.CommandBatchSerializer, description="Queued: one command per target node."),
        },
        examples=command_examples(),
        description=(
            "Send a command to one node (`node_id`) or to every online node of the cluster (`node_id` null "
            "or absent); Owners and Admins only. The payload's fields depend on `command_type` (errors "
            "name them `payload.<field>`). Answers 202 at once: the commands are queued and delivered "
            "through the node's tunnel; follow them with GET /commands/?batch=<batch_id>."
        ),
    )
    @action(detail=True, methods=["get", "post"], serializer_class=s.CommandSerializer)
    def commands(self, request: Request, pk: str | None = None) -> Response:
        """GET: the cluster's commands. POST: dispatch a command to one node or every online node."""
        cluster = self.get_object()
        if request.method == "GET":
            commands = COMMAND_FILTERS.apply(
                selectors.command_list(user=request.user, cluster=cluster), request.query_params
            )
            page = self.paginate_queryset(commands)
            return self.get_paginated_response(s.CommandSerializer(page, many=True).data)
        data = validated(s.CommandDispatchSerializer, request.data)
        node = None
        if data["node_id"] is not None:
            node = selectors.node_list(user=request.user, cluster=cluster).filter(pk=data["node_id"]).first()
            if node is None:
                raise exceptions.ValidationError({"node_id": ["No such node in this cluster."]})
        created = services.command_dispatch(
            actor=request.user,
            cluster=cluster,
            command_type=data["command_type"],
            payload=data["payload"],
            node=node,
        )
        body = {"batch_id": str(created[0].batch_id), "commands": s.CommandSerializer(created, many=True).data}
        return Response(body, status=202)


@extend_schema_view(partial_update=extend_schema(request=s.NodeRenameSerializer, responses={200: s.NodeSerializer}))
class NodeViewSet(
    ServiceErrorsMixin,
    FilteredMixin,
    WorkspaceScopedMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.UpdateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """Nodes: list, inspect, rename (PATCH name), cordon/uncordon/drain, delete (revokes)."""

    serializer_class = s.NodeSerializer
    queryset = Node.objects.all()
    workspace_field = "cluster__workspace"
    filterset = NODE_FILTERS
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_base_queryset(self) -> QuerySet[Node]:
        return selectors.node_base()

    def partial_update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        node = self.get_object()
        data = validated(s.NodeRenameSerializer, request.data)
        services.node_rename(node=node, actor=request.user, name=data["name"])
        return Response(s.NodeSerializer(self.get_queryset().get(pk=node.pk)).data)

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        services.node_delete(node=self.get_object(), actor=request.user)
        return Response(status=204)

    def _transition(self, fn: Any) -> Response:
        node = fn(node=self.get_object(), actor=self.request.user)
        return Response(s.NodeSerializer(self.get_queryset().get(pk=node.pk)).data)

    @extend_schema(request=None, responses={200: s.NodeSerializer})
    @action(detail=True, methods=["post"])
    def cordon(self, request: Request, pk: str | None = None) -> Response:
        """online/offline → cordoned."""
        return self._transition(services.node_cordon)

    @extend_schema(request=None, responses={200: s.NodeSerializer})
    @action(detail=True, methods=["post"])
    def uncordon(self, request: Request, pk: str | None = None) -> Response:
        """cordoned/draining → online."""
        return self._transition(services.node_uncordon)

    @extend_schema(request=None, responses={200: s.NodeSerializer})
    @action(detail=True, methods=["post"])
    def drain(self, request: Request, pk: str | None = None) -> Response:
        """online/cordoned → draining (→ cordoned when empty)."""
        return self._transition(services.node_drain)

    @extend_schema(
        request=None,
        responses={202: OpenApiResponse(s.CommandSerializer, description="Queued: the node's `agent.update` command.")},
    )
    @action(detail=True, methods=["post"], url_path="update-agent", serializer_class=s.CommandSerializer)
    def update_agent(self, request: Request, pk: str | None = None) -> Response:
        """Update this node's agent to the served version (Owner/Admin); 202 with the `agent.update` command."""
        command = agent_updates.node_update_agent(node=self.get_object(), actor=request.user)
        return Response(s.CommandSerializer(command).data, status=202)

    @extend_schema(parameters=PAGING, responses={200: page_of(s.NodeEventSerializer)})
    @action(detail=True, methods=["get"], serializer_class=s.NodeEventSerializer)
    def events(self, request: Request, pk: str | None = None) -> Response:
        """The node's event log, newest first."""
        page = self.paginate_queryset(selectors.node_event_list(node=self.get_object()))
        return self.get_paginated_response(s.NodeEventSerializer(page, many=True).data)


class CommandViewSet(ServiceErrorsMixin, FilteredMixin, WorkspaceScopedMixin, viewsets.ReadOnlyModelViewSet):
    """Commands of the caller's workspaces (filters: cluster, node, batch, status, command_type, system,
    by: a username or `system`)."""

    serializer_class = s.CommandSerializer
    queryset = Command.objects.all()
    workspace_field = "cluster__workspace"
    filterset = COMMAND_FILTERS

    def get_base_queryset(self) -> QuerySet:
        return selectors.command_base()


@extend_schema_view(
    create=extend_schema(request=s.NamespaceCreateSerializer, responses={201: s.NamespaceSerializer}),
    partial_update=extend_schema(request=s.NamespaceBindSerializer, responses={200: s.NamespaceSerializer}),
)
class NamespaceViewSet(ServiceErrorsMixin, FilteredMixin, WorkspaceScopedMixin, viewsets.ModelViewSet):
    """Namespaces and their cluster binding."""

    serializer_class = s.NamespaceSerializer
    queryset = Namespace.objects.all()
    filterset = NAMESPACE_FILTERS
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]

    def get_base_queryset(self) -> QuerySet[Namespace]:
        return selectors.namespace_base()

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        data = validated(s.NamespaceCreateSerializer, request.data)
        workspace = self.get_workspace_from_request(data["workspace"])
        namespace = services.namespace_create(
            actor=request.user, workspace=workspace, name=data["name"], cluster_id=data["cluster"]
        )
        return Response(s.NamespaceSerializer(namespace).data, status=201)

    def partial_update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        namespace = self.get_object()
        data = validated(s.NamespaceBindSerializer, request.data)
        namespace = services.namespace_bind(actor=request.user, namespace=namespace, cluster_id=data["cluster"])
        return Response(s.NamespaceSerializer(namespace).data)

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        services.namespace_delete(actor=request.user, namespace=self.get_object())
        return Response(status=204)


class AgentRegisterThrottle(SettingsRateThrottle):
    """AGENT_REGISTER_RATE per client IP."""

    scope = "agent-register"
    rate_setting = "AGENT_REGISTER_RATE"


class AgentRegisterView(ServiceErrorsMixin, APIView):
    """POST /agent/register: the join token authenticates; returns the node id and its certificate.

    Limited to AGENT_REGISTER_RATE per client IP (429 with Retry-After).
    """

    authentication_classes: list = []
    permission_classes = [AllowAny]
    throttle_classes = [AgentRegisterThrottle]
    serializer_class = s.AgentRegisterSerializer

    @extend_schema(request=s.AgentRegisterSerializer, responses={201: s.AgentRegisteredSerializer}, auth=[])
    def post(self, request: Request) -> Response:
        data = validated(s.AgentRegisterSerializer, request.data)
        node, cert_pem = services.node_register(
            token=data["token"], csr_pem=data["csr_pem"], facts=data["facts"], cluster_id=data["cluster_id"]
        )
        return Response(
            {
                "node_id": str(node.pk),
                "certificate_pem": cert_pem,
                "ca_certificate_pem": ca.ca_certificate_pem(),
                "tunnel_path": protocol.TUNNEL_PATH,
                "heartbeat_interval_s": int(protocol.HEARTBEAT_INTERVAL_S),
            },
            status=201,
        )


@extend_schema(exclude=True)
class AgentRegisterAlias(AgentRegisterView):
    """POST /agent/register/ (with the slash): the same view, left out of the schema as a duplicate."""

"""REST API for the caller's own API keys: /api-keys/ (create shows the secret once; DELETE revokes).

Keys are managed by a signed-in member (session) or with an older DRF token; a request made with an API
key cannot create or revoke keys.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Prefetch, QuerySet
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, mixins, serializers, status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from fleet.workloads import services as workload_services
from fleet.workloads.models import ApiKeyEndpoint, Endpoint
from kernel.api import ServiceErrorsMixin
from tenancy.api_keys import KeyGrant
from tenancy.mixins import WorkspaceScopedMixin
from tenancy.models import ApiKey, ApiKeyScope


class ApiKeySerializer(serializers.ModelSerializer):
    """A key as lists show it: never its secret."""

    key_prefix = serializers.CharField(source="display", read_only=True)
    endpoints = serializers.SerializerMethodField()

    class Meta:
        model = ApiKey
        fields = [
            "id",
            "name",
            "workspace",
            "key_prefix",
            "scopes",
            "endpoints",
            "requests_per_min",
            "tokens_per_min",
            "expires_at",
            "last_used_at",
            "last_used_ip",
            "revoked_at",
            "created_at",
        ]
        read_only_fields = fields

    def get_endpoints(self, obj: ApiKey) -> list[str]:
        """The endpoints the key is limited to (empty: every endpoint of its workspace)."""
        return [str(grant.endpoint_id) for grant in obj.endpoint_grants.all() if grant.endpoint_id is not None]


class ApiKeyCreatedSerializer(ApiKeySerializer):
    """A key just created, with its secret (shown this once)."""

    key = serializers.CharField(read_only=True)

    class Meta(ApiKeySerializer.Meta):
        fields = [*ApiKeySerializer.Meta.fields, "key"]
        read_only_fields = fields


class ApiKeyCreateSerializer(serializers.Serializer):
    """What a new key needs."""

    workspace = serializers.UUIDField()
    name = serializers.CharField(max_length=100)
    scopes = serializers.ListField(child=serializers.ChoiceField(choices=ApiKeyScope.choices), min_length=1)
    endpoints = serializers.ListField(child=serializers.UUIDField(), required=False, default=list)
    expires_at = serializers.DateTimeField(required=False, allow_null=True, default=None)
    requests_per_min = serializers.IntegerField(
        required=False, allow_null=True, default=None, min_value=1, max_value=workload_services.MAX_PER_MINUTE
    )
    tokens_per_min = serializers.IntegerField(
        required=False, allow_null=True, default=None, min_value=1, max_value=workload_services.MAX_PER_MINUTE
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(self.initial_data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError({name: "Unknown field." for name in unknown})
        return attrs


class ApiKeyViewSet(
    ServiceErrorsMixin,
    WorkspaceScopedMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    viewsets.GenericViewSet,
):
    """The caller's own API keys: list, retrieve, create (the secret is in this answer only), DELETE revokes."""

    serializer_class = ApiKeySerializer
    queryset = ApiKey.objects.all()

    def get_base_queryset(self) -> QuerySet[ApiKey]:
        grants = Prefetch("endpoint_grants", queryset=ApiKeyEndpoint.objects.order_by("pk"))
        return ApiKey.objects.filter(user=self.request.user).prefetch_related(grants).order_by("-created_at", "pk")

    def _refuse_keys(self, request: Request) -> None:
        if isinstance(request.auth, KeyGrant):
            raise exceptions.PermissionDenied("API keys are managed while signed in, not with an API key.")

    @extend_schema(request=ApiKeyCreateSerializer, responses={201: ApiKeyCreatedSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Create a key for yourself in one of your workspaces; the answer holds its secret, shown only now."""
        self._refuse_keys(request)
        data = ApiKeyCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        workspace = self.get_workspace_from_request(values["workspace"])
        wanted = set(values["endpoints"])
        endpoints = list(Endpoint.objects.select_related("cluster").filter(pk__in=wanted, cluster__workspace=workspace))
        if len(endpoints) != len(wanted):
            raise exceptions.ValidationError({"endpoints": "No such endpoint in this workspace."})
        key, raw = workload_services.api_key_create(
            actor=request.user,
            workspace=workspace,
            name=values["name"],
            scopes=values["scopes"],
            endpoints=endpoints,
            expires_at=values["expires_at"],
            requests_per_min=values["requests_per_min"],
            tokens_per_min=values["tokens_per_min"],
        )
        key = self.get_base_queryset().get(pk=key.pk)
        key.key = raw
        # the secret must not stay in a browser's or a proxy's cache
        headers = {"Cache-Control": "no-store", "Pragma": "no-cache"}
        return Response(ApiKeyCreatedSerializer(key).data, status=status.HTTP_201_CREATED, headers=headers)

    @extend_schema(responses={204: None})
    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """Revoke the key: every replica refuses it within a second. 409 if it is already revoked."""
        self._refuse_keys(request)
        workload_services.api_key_revoke(actor=request.user, key=self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)

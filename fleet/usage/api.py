"""`GET /api/v1/usage/`: a period's usage totals, series per bucket and sums per endpoint, key and cluster.

The query serializer is shared with the Usage page and its CSV export (`fleet.usage.views`).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import exceptions, serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from fleet.usage import budgets, selectors, services
from fleet.usage.models import Budget, PriceVersion, SubjectKind
from kernel import outbound_urls
from kernel.api import ServiceErrorsMixin, validated
from tenancy.models import ApiKey
from tenancy.selectors import workspace_ids, workspace_list


class UsageQuerySerializer(serializers.Serializer):
    """The filters of a usage read; workspaces and endpoints must be the caller's."""

    period = serializers.ChoiceField(choices=list(selectors.PERIODS), default="24h")
    workspace = serializers.UUIDField(required=False, allow_null=True)
    endpoint = serializers.UUIDField(required=False, allow_null=True)
    api_key = serializers.IntegerField(required=False, allow_null=True, min_value=1)

    def _user(self) -> Any:
        return self.context["user"]

    def validate_workspace(self, value: Any) -> Any:
        if value is not None and not workspace_ids(user=self._user()).filter(workspace_id=value).exists():
            raise serializers.ValidationError("No such workspace.")
        return value

    def validate_endpoint(self, value: Any) -> Any:
        if value is not None and not selectors.usage_endpoints(user=self._user()).filter(pk=value).exists():
            raise serializers.ValidationError("No such endpoint.")
        return value

    def query(self) -> selectors.UsageQuery:
        data = self.validated_data
        return selectors.UsageQuery(
            period=data["period"],
            workspace_id=data.get("workspace"),
            endpoint_id=data.get("endpoint"),
            api_key_id=data.get("api_key"),
        )


class _Counters(serializers.Serializer):
    requests = serializers.IntegerField()
    errors = serializers.IntegerField()
    rate_limited = serializers.IntegerField(help_text="Requests refused 429 by an API key's rate limit.")
    prompt_tokens = serializers.IntegerField()
    completion_tokens = serializers.IntegerField()
    latency_ms_mean = serializers.FloatField(allow_null=True, help_text="Mean request duration (to the end).")
    node_hours = serializers.FloatField()
    gpu_hours = serializers.FloatField()
    container_hours = serializers.FloatField()
    cpu_core_hours = serializers.FloatField()
    memory_gib_hours = serializers.FloatField()
    cost = serializers.DecimalField(max_digits=20, decimal_places=6, help_text="At the prices then in force.")


class UsageBucketSerializer(_Counters):
    bucket_start = serializers.DateTimeField()


class UsageSubjectSerializer(_Counters):
    workspace_id = serializers.UUIDField()
    subject_kind = serializers.ChoiceField(choices=SubjectKind.choices)
    subject_id = serializers.UUIDField()
    name = serializers.CharField()
    api_key_id = serializers.IntegerField(allow_null=True, help_text="The API key of the requests (null: none).")
    api_key_name = serializers.CharField(help_text='Its name and public prefix ("" for none).')


class UsageSerializer(serializers.Serializer):
    period = serializers.CharField()
    granularity = serializers.CharField()
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    currency = serializers.CharField(help_text='The price table\'s currency ("" while no price is set).')
    unpriced = serializers.BooleanField(help_text="Some usage fell before the first price version (cost 0).")
    totals = _Counters()
    series = UsageBucketSerializer(many=True)
    subjects = UsageSubjectSerializer(many=True)


def usage_report(*, user: Any, query: selectors.UsageQuery) -> dict[str, Any]:
    """What the API answers and the page shows for `query`."""
    rows = selectors.usage_rollups(user=user, query=query)
    start, end, _ = query.window()
    costs = selectors.usage_costs(rows=rows)
    series = selectors.usage_series(rows=rows, query=query)
    for bucket in series:
        bucket["cost"] = costs.by_bucket.get(bucket["bucket_start"], Decimal(0))
    subjects = selectors.usage_by_subject(rows=rows)
    for subject in subjects:
        subject["cost"] = costs.by_subject.get(tuple(subject[k] for k in selectors.KEY), Decimal(0))
    return {
        "period": query.period,
        "granularity": query.granularity,
        "start": start,
        "end": end,
        "currency": costs.currency,
        "unpriced": costs.unpriced,
        "totals": selectors.usage_totals(rows=rows) | {"cost": costs.total},
        "series": series,
        "subjects": subjects,
    }


class UsageView(APIView):
    """Usage of the caller's workspaces over a period: endpoint requests, errors, tokens and latency (per
    endpoint and API key), node-, GPU-, container-, CPU core- and GiB-hours (per cluster), each with its cost at
    the prices in force when it was used."""

    @extend_schema(
        parameters=[
            OpenApiParameter("period", str, enum=list(selectors.PERIODS), description="default 24h"),
            OpenApiParameter("workspace", str, description="one workspace's id"),
            OpenApiParameter("endpoint", str, description="one endpoint's id (endpoint rows only)"),
            OpenApiParameter("api_key", int, description="one API key's id (endpoint rows only)"),
        ],
        responses={200: UsageSerializer},
    )
    def get(self, request: Request) -> Response:
        params = UsageQuerySerializer(data=request.query_params, context={"user": request.user})
        params.is_valid(raise_exception=True)
        return Response(UsageSerializer(usage_report(user=request.user, query=params.query())).data)


class PriceVersionSerializer(serializers.ModelSerializer):
    """One version of the price table (read; and the body of a new one)."""

    class Meta:
        model = PriceVersion
        fields = [
            "id",
            "effective_from",
            "currency",
            "node_hour",
            "cluster_node_hour",
            "gpu_hour",
            "gpu_model_hour",
            "cpu_core_hour",
            "memory_gib_hour",
            "prompt_per_million",
            "completion_per_million",
            "endpoint_tokens",
            "note",
            "created_at",
        ]
        read_only_fields = ["id", "created_at"]


class PriceVersionsView(ServiceErrorsMixin, APIView):
    """The operator's price table, every version oldest first; staff add a version (never edit one: a past
    period keeps the prices it was costed at)."""

    @extend_schema(responses={200: PriceVersionSerializer(many=True)})
    def get(self, request: Request) -> Response:
        return Response(PriceVersionSerializer(PriceVersion.objects.order_by("effective_from"), many=True).data)

    @extend_schema(request=PriceVersionSerializer, responses={201: PriceVersionSerializer})
    def post(self, request: Request) -> Response:
        if not request.user.is_staff:
            raise exceptions.PermissionDenied("Only operators (staff) set prices.")
        data = validated(PriceVersionSerializer, request.data)
        version = services.price_version_create(actor=request.user, **data)
        return Response(PriceVersionSerializer(version).data, status=201)


class BudgetSerializer(serializers.ModelSerializer):
    """A budget and its month so far (as of the latest minute's evaluation)."""

    webhook = serializers.SerializerMethodField(help_text="The webhook's scheme and host (its path may hold a secret).")
    shares = serializers.SerializerMethodField(help_text='The share of each limit used: {"tokens": 0.85}.')

    class Meta:
        model = Budget
        fields = [
            "id",
            "workspace",
            "api_key",
            "token_limit",
            "money_limit",
            "hard_stop",
            "webhook",
            "month",
            "spent_tokens",
            "spent_money",
            "level",
            "shares",
            "evaluated_at",
        ]
        read_only_fields = fields

    def get_webhook(self, obj: Budget) -> str:
        parts = urlsplit(obj.webhook_url)
        return f"{parts.scheme}://{parts.netloc}/…" if obj.webhook_url else ""

    def get_shares(self, obj: Budget) -> dict[str, float]:
        return obj.shares()


class BudgetSetSerializer(serializers.Serializer):
    """PUT budgets/: set (create or replace) the budget of a workspace, or of one of its API keys."""

    workspace = serializers.UUIDField()
    api_key = serializers.IntegerField(required=False, allow_null=True, help_text="Empty: the whole workspace.")
    token_limit = serializers.IntegerField(required=False, allow_null=True, min_value=0)
    money_limit = serializers.DecimalField(
        max_digits=14, decimal_places=2, required=False, allow_null=True, min_value=Decimal(0)
    )
    hard_stop = serializers.BooleanField(required=False, default=False)
    webhook_url = serializers.URLField(required=False, allow_blank=True, default="")

    def validate_webhook_url(self, value: str) -> str:
        problem = outbound_urls.literal_problem(value, settings.OUTBOUND_URL_ALLOWED_HOSTS) if value else None
        if problem is not None:
            raise serializers.ValidationError(problem)
        return value


class BudgetsView(ServiceErrorsMixin, APIView):
    """Monthly budgets (tokens and/or money) of the caller's workspaces and their keys; Owners set them."""

    @extend_schema(responses={200: BudgetSerializer(many=True)})
    def get(self, request: Request) -> Response:
        return Response(BudgetSerializer(selectors.budget_list(user=request.user).order_by("pk"), many=True).data)

    @extend_schema(request=BudgetSetSerializer, responses={200: BudgetSerializer})
    def put(self, request: Request) -> Response:
        data = validated(BudgetSetSerializer, request.data)
        workspace = workspace_list(user=request.user).filter(pk=data.pop("workspace")).first()
        if workspace is None:
            raise exceptions.ValidationError({"workspace": ["No such workspace."]})
        key_id = data.pop("api_key", None)
        key = ApiKey.objects.filter(pk=key_id, workspace=workspace).first() if key_id is not None else None
        if key_id is not None and key is None:
            raise exceptions.ValidationError({"api_key": ["No such API key in this workspace."]})
        budget = budgets.budget_set(actor=request.user, workspace=workspace, api_key=key, **data)
        return Response(BudgetSerializer(budget).data)

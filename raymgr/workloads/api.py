"""API for Ray workloads, mounted under /api/v1/ray/: training-jobs, tune-experiments, deployments.

Thin: input serializers parse, services decide. ValidationError → 400 with field messages,
PermissionDenied → 403, IllegalTransition → 409; other workspaces' rows → 404 (WorkspaceScopedMixin).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import exceptions, serializers, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from kernel.api import ServiceErrorsMixin, validated
from kernel.schema import UUID, query
from raymgr.models import RayCluster
from raymgr.workloads import health, selectors, services
from raymgr.workloads.models import ServeDeployment, TrainingJob, TuneExperiment, TuneTrial
from tenancy.mixins import WorkspaceScopedMixin


class _Create(serializers.Serializer):
    workspace = serializers.UUIDField()
    ray_cluster = serializers.UUIDField()
    name = serializers.CharField(max_length=63)


class _QueuedCreate(_Create):
    priority = serializers.IntegerField(
        required=False, min_value=0, max_value=100, help_text="0-100 (default 50); higher starts first."
    )
    queue_timeout_s = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, help_text="Fail if still queued after this many seconds."
    )


class TrainingJobCreateSerializer(_QueuedCreate):
    """POST training-jobs/."""

    kind = serializers.CharField(required=False)
    script = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False)
    entrypoint = serializers.CharField(required=False, allow_blank=True, max_length=2000)
    framework = serializers.CharField(required=False)
    config = serializers.DictField(required=False)
    num_workers = serializers.IntegerField(required=False)
    cpus_per_worker = serializers.FloatField(required=False)
    gpus_per_worker = serializers.FloatField(required=False)
    checkpoint_every = serializers.IntegerField(required=False, min_value=0)
    checkpoints_to_keep = serializers.IntegerField(required=False)
    storage_path = serializers.CharField(required=False, allow_blank=True, max_length=1000)


class TuneExperimentCreateSerializer(_QueuedCreate):
    """POST tune-experiments/."""

    search_space = serializers.JSONField()
    metric = serializers.CharField(required=False, max_length=100)
    mode = serializers.CharField(required=False)
    num_samples = serializers.IntegerField(required=False)
    max_concurrent_trials = serializers.IntegerField(required=False)
    max_iterations = serializers.IntegerField(required=False)
    scheduler = serializers.CharField(required=False)
    scheduler_config = serializers.DictField(required=False)
    objective_code = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False)
    cpus_per_trial = serializers.FloatField(required=False)
    gpus_per_trial = serializers.FloatField(required=False)
    training_script = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False)


class ServeDeploymentCreateSerializer(_Create):
    """POST deployments/."""

    engine = serializers.CharField(required=False)
    model = serializers.CharField(required=False, allow_blank=True, max_length=300)
    checkpoint_job = serializers.UUIDField(required=False, allow_null=True)
    checkpoint_path = serializers.CharField(required=False, allow_blank=True, max_length=1000)
    code = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False)
    route_prefix = serializers.CharField(required=False, allow_blank=True, max_length=200)
    http_port = serializers.IntegerField(required=False)
    num_replicas = serializers.IntegerField(required=False)
    autoscaling = serializers.BooleanField(required=False)
    min_replicas = serializers.IntegerField(required=False)
    max_replicas = serializers.IntegerField(required=False)
    target_ongoing_requests = serializers.FloatField(required=False)
    cpus_per_replica = serializers.FloatField(required=False)
    gpus_per_replica = serializers.FloatField(required=False)


class TrainWithBestSerializer(serializers.Serializer):
    """POST tune-experiments/<id>/train/."""

    name = serializers.CharField(max_length=63)
    storage_path = serializers.CharField(required=False, allow_blank=True, max_length=1000)


def _hints(obj: TrainingJob | TuneExperiment) -> list[dict[str, str]]:
    from django.utils import timezone

    found = health.row_job_hints(obj, now=timezone.now())
    return [{"problem": h.problem, "cause": h.cause, "severity": h.severity} for h in found]


class _QueuePosition(serializers.Serializer):
    """`queue_position`: 1 = next to start on its Ray cluster; null unless waiting in the queue. Read once per
    cluster per response (the serializer's context caches each cluster's queue)."""

    queue_position = serializers.SerializerMethodField()

    def get_queue_position(self, obj: TrainingJob | TuneExperiment) -> int | None:
        if obj.status != "queued" or obj.submitted_at is not None:
            return None
        cache = self.context.setdefault("queue_positions", {}) if isinstance(self.context, dict) else {}
        if obj.ray_cluster_id not in cache:
            cache[obj.ray_cluster_id] = selectors.queue_positions(obj.ray_cluster_id)
        return cache[obj.ray_cluster_id].get(obj.pk)


class TrainingJobSerializer(_QueuePosition, serializers.ModelSerializer):
    """A training job as read."""

    hints = serializers.SerializerMethodField()
    status_sentence = serializers.CharField(read_only=True, help_text="What the status means now, as the page says it.")

    class Meta:
        model = TrainingJob
        exclude = ["last_status"]
        read_only_fields = [f.name for f in TrainingJob._meta.fields]

    def get_hints(self, obj: TrainingJob) -> list[dict[str, str]]:
        return _hints(obj)


class TuneTrialSerializer(serializers.ModelSerializer):
    """One trial row."""

    class Meta:
        model = TuneTrial
        fields = ["trial_id", "status", "config", "iterations", "metric_value", "last_result", "updated_at"]


class TuneExperimentSerializer(_QueuePosition, serializers.ModelSerializer):
    """A Tune experiment with its trial table."""

    trials = TuneTrialSerializer(many=True, read_only=True)
    hints = serializers.SerializerMethodField()
    status_sentence = serializers.CharField(read_only=True, help_text="What the status means now, as the page says it.")

    class Meta:
        model = TuneExperiment
        exclude = ["last_status"]
        read_only_fields = [f.name for f in TuneExperiment._meta.fields]

    def get_hints(self, obj: TuneExperiment) -> list[dict[str, str]]:
        return _hints(obj)


class ServeDeploymentSerializer(serializers.ModelSerializer):
    """A Serve deployment as read; `proxy_url` reaches it through the tunnel proxy on its own origin,
    `endpoint_url` on the node."""

    proxy_url = serializers.SerializerMethodField()

    class Meta:
        model = ServeDeployment
        fields = "__all__"
        read_only_fields = [f.name for f in ServeDeployment._meta.fields]

    def get_proxy_url(self, obj: ServeDeployment) -> str:
        return obj.url


class _WorkloadViewSet(ServiceErrorsMixin, WorkspaceScopedMixin, viewsets.ReadOnlyModelViewSet):
    """One generic API for the three kinds: list/retrieve scoped to the caller's workspaces (?workspace=,
    ?status=, ?ray_cluster=), create, and the kind's stop action. Subclasses only say what differs."""

    create_input: type[serializers.Serializer]  # the POST body
    create_service: Callable[..., Any]  # service(actor=, workspace=, ray_cluster=, **fields) → row
    stop_service: Callable[[Any, Any], Any]  # (actor, row) → row: the kind's cancel / stop service

    def get_base_queryset(self) -> QuerySet:
        rows = self.queryset.select_related("ray_cluster", "workspace")  # type: ignore[union-attr]
        params = self.request.query_params
        statuses = self.statuses()
        for name in ("workspace", "status", "ray_cluster"):
            value = params.get(name)
            if not value:
                continue
            if name == "status" and value not in statuses:
                raise exceptions.ValidationError({name: [f"Choose one of {', '.join(statuses)}."]})
            if name != "status":
                try:
                    value = uuid.UUID(value)
                except ValueError:
                    raise exceptions.ValidationError({name: ["Must be a UUID."]}) from None
            rows = rows.filter(**{name: value})
        return rows

    @classmethod
    def statuses(cls) -> list[str]:
        """The states a row of this kind can be in (the `status` filter's choices)."""
        return [value for value, _ in cls.queryset.model._meta.get_field("status").choices]  # type: ignore[union-attr]

    @classmethod
    def annotate_schema(cls, **actions: Any) -> Callable[[type], type]:
        """The kind's schema: list filters, the create body, the row each action answers."""
        read = cls.serializer_class
        return extend_schema_view(
            list=extend_schema(
                parameters=[
                    query("workspace", UUID, "Only this workspace's."),
                    query("ray_cluster", UUID, "Only those on this Ray cluster."),
                    query("status", {"type": "string", "enum": cls.statuses()}, "By status."),
                ]
            ),
            create=extend_schema(request=cls.create_input, responses={201: read}),
            **{
                name: extend_schema(request=body, responses={code: answer or read})
                for name, (body, code, answer) in actions.items()
            },
        )

    def _cluster(self, data: dict[str, Any]) -> tuple[Any, RayCluster]:
        workspace = self.get_workspace_from_request(data.pop("workspace"))
        cluster = RayCluster.objects.filter(pk=data.pop("ray_cluster"), workspace=workspace).first()
        if cluster is None:
            raise exceptions.ValidationError({"ray_cluster": ["No such Ray cluster in this workspace."]})
        return workspace, cluster

    def prepare(self, data: dict[str, Any], workspace: Any) -> dict[str, Any]:
        """Turn validated input into the service's keyword arguments (ids into rows, say)."""
        return data

    def _read(self, obj: Any) -> dict[str, Any]:
        return self.get_serializer(self.get_queryset().get(pk=obj.pk)).data

    def create(self, request: Request) -> Response:
        data = validated(self.create_input, request.data)
        workspace, cluster = self._cluster(data)
        fields = self.prepare(data, workspace)
        row = type(self).create_service(actor=request.user, workspace=workspace, ray_cluster=cluster, **fields)
        return Response(self._read(row), status=201)

    def _stop(self, request: Request) -> Response:
        return Response(self._read(type(self).stop_service(request.user, self.get_object())))


class TrainingJobViewSet(_WorkloadViewSet):
    """Training jobs: submit, list, inspect (logs, traceback, checkpoints, hints), cancel."""

    queryset = TrainingJob.objects.all()
    serializer_class = TrainingJobSerializer
    create_input = TrainingJobCreateSerializer
    create_service = services.training_job_create
    stop_service = staticmethod(lambda actor, job: services.training_job_cancel(actor=actor, job=job))

    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        """Cancel a queued or running job."""
        return self._stop(request)


class TuneExperimentViewSet(_WorkloadViewSet):
    """Tune experiments: create, list, inspect (trials, best config), cancel, train with best config."""

    queryset = TuneExperiment.objects.prefetch_related("trials")
    serializer_class = TuneExperimentSerializer
    create_input = TuneExperimentCreateSerializer
    create_service = services.tune_experiment_create
    stop_service = staticmethod(
        lambda actor, experiment: services.tune_experiment_cancel(actor=actor, experiment=experiment)
    )

    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        """Cancel the experiment's Ray job."""
        return self._stop(request)

    @action(detail=True, methods=["post"])
    def train(self, request: Request, pk: str | None = None) -> Response:
        """Train with best config: creates a training job."""
        experiment = self.get_object()
        data = validated(TrainWithBestSerializer, request.data)
        job = services.tune_train_with_best(actor=request.user, experiment=experiment, **data)
        return Response(TrainingJobSerializer(job).data, status=201)


class ServeDeploymentViewSet(_WorkloadViewSet):
    """Serve deployments: deploy, list, inspect (status, replica logs, endpoint URL), stop."""

    queryset = ServeDeployment.objects.all()
    serializer_class = ServeDeploymentSerializer
    create_input = ServeDeploymentCreateSerializer
    create_service = services.serve_deployment_create
    stop_service = staticmethod(
        lambda actor, deployment: services.serve_deployment_stop(actor=actor, deployment=deployment)
    )

    def prepare(self, data: dict[str, Any], workspace: Any) -> dict[str, Any]:
        job_id = data.pop("checkpoint_job", None)
        job = None
        if job_id is not None:
            job = TrainingJob.objects.filter(pk=job_id, workspace=workspace).first()
            if job is None:
                raise exceptions.ValidationError({"checkpoint_job": ["No such training job in this workspace."]})
        return {**data, "checkpoint_job": job}

    @action(detail=True, methods=["post"])
    def stop(self, request: Request, pk: str | None = None) -> Response:
        """Delete the Serve application from the cluster."""
        return self._stop(request)


# their schemas (extend_schema_view annotates the classes in place)
TrainingJobViewSet.annotate_schema(cancel=(None, 200, None))(TrainingJobViewSet)
TuneExperimentViewSet.annotate_schema(
    cancel=(None, 200, None), train=(TrainWithBestSerializer, 201, TrainingJobSerializer)
)(TuneExperimentViewSet)
ServeDeploymentViewSet.annotate_schema(stop=(None, 200, None))(ServeDeploymentViewSet)

"""API for Ray workloads, mounted under /api/v1/ray/: training-jobs, tune-experiments, deployments.

Thin: input serializers parse, services decide. ValidationError → 400 with field messages,
PermissionDenied → 403, IllegalTransition → 409; other workspaces' rows → 404 (WorkspaceScopedMixin).
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from rest_framework import exceptions, serializers, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from cleverthis.api import ServiceErrorsMixin, validated
from cleverthis.tenancy.mixins import WorkspaceScopedMixin
from raymgr.models import RayCluster
from raymgr.workload_models import ServeDeployment, TrainingJob, TuneExperiment, TuneTrial
from raymgr.workloads import health, services


class _Create(serializers.Serializer):
    workspace = serializers.UUIDField()
    ray_cluster = serializers.UUIDField()
    name = serializers.CharField(max_length=63)


class TrainingJobCreateSerializer(_Create):
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


class TuneExperimentCreateSerializer(_Create):
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

    found = health.job_hints(
        status=obj.status,
        queue_reason=getattr(obj, "queue_reason", "") or obj.failure_reason,
        submitted_at=obj.submitted_at,
        created_at=obj.created_at,
        finished_at=obj.finished_at,
        traceback=obj.traceback,
        failure_reason=obj.failure_reason,
        cluster_status=obj.ray_cluster.last_status,
        now=timezone.now(),
    )
    return [{"problem": h.problem, "cause": h.cause, "severity": h.severity} for h in found]


class TrainingJobSerializer(serializers.ModelSerializer):
    """A training job as read."""

    hints = serializers.SerializerMethodField()

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


class TuneExperimentSerializer(serializers.ModelSerializer):
    """A Tune experiment with its trial table."""

    trials = TuneTrialSerializer(many=True, read_only=True)
    hints = serializers.SerializerMethodField()

    class Meta:
        model = TuneExperiment
        exclude = ["last_status"]
        read_only_fields = [f.name for f in TuneExperiment._meta.fields]

    def get_hints(self, obj: TuneExperiment) -> list[dict[str, str]]:
        return _hints(obj)


class ServeDeploymentSerializer(serializers.ModelSerializer):
    """A Serve deployment as read; `proxy_url` reaches it through the control plane, `endpoint_url` on the node."""

    proxy_url = serializers.SerializerMethodField()

    class Meta:
        model = ServeDeployment
        fields = "__all__"
        read_only_fields = [f.name for f in ServeDeployment._meta.fields]

    def get_proxy_url(self, obj: ServeDeployment) -> str:
        request = self.context.get("request")
        return request.build_absolute_uri(obj.proxy_path) if request is not None else obj.proxy_path


class _WorkloadViewSet(ServiceErrorsMixin, WorkspaceScopedMixin, viewsets.ReadOnlyModelViewSet):
    """List/retrieve scoped to the caller's workspaces (?workspace=, ?status=, ?ray_cluster=)."""

    def get_base_queryset(self) -> QuerySet:
        rows = self.queryset.select_related("ray_cluster", "workspace")  # type: ignore[union-attr]
        params = self.request.query_params
        for name in ("workspace", "status", "ray_cluster"):
            if params.get(name):
                try:
                    rows = rows.filter(**{name: params[name]})
                except Exception:
                    raise exceptions.ValidationError({name: ["Invalid value."]}) from None
        return rows

    def _cluster(self, data: dict[str, Any]) -> tuple[Any, RayCluster]:
        workspace = self.get_workspace_from_request(data.pop("workspace"))
        cluster = RayCluster.objects.filter(pk=data.pop("ray_cluster"), workspace=workspace).first()
        if cluster is None:
            raise exceptions.ValidationError({"ray_cluster": ["No such Ray cluster in this workspace."]})
        return workspace, cluster

    def _read(self, obj: Any) -> dict[str, Any]:
        return self.get_serializer(self.get_queryset().get(pk=obj.pk)).data


class TrainingJobViewSet(_WorkloadViewSet):
    """Training jobs: submit, list, inspect (logs, traceback, checkpoints, hints), cancel."""

    queryset = TrainingJob.objects.all()
    serializer_class = TrainingJobSerializer

    def create(self, request: Request) -> Response:
        data = validated(TrainingJobCreateSerializer, request.data)
        workspace, cluster = self._cluster(data)
        job = services.training_job_create(actor=request.user, workspace=workspace, ray_cluster=cluster, **data)
        return Response(self._read(job), status=201)

    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        """Cancel a queued or running job."""
        return Response(self._read(services.training_job_cancel(actor=request.user, job=self.get_object())))


class TuneExperimentViewSet(_WorkloadViewSet):
    """Tune experiments: create, list, inspect (trials, best config), cancel, train with best config."""

    queryset = TuneExperiment.objects.prefetch_related("trials")
    serializer_class = TuneExperimentSerializer

    def create(self, request: Request) -> Response:
        data = validated(TuneExperimentCreateSerializer, request.data)
        workspace, cluster = self._cluster(data)
        experiment = services.tune_experiment_create(
            actor=request.user, workspace=workspace, ray_cluster=cluster, **data
        )
        return Response(self._read(experiment), status=201)

    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        """Cancel the experiment's Ray job."""
        experiment = services.tune_experiment_cancel(actor=request.user, experiment=self.get_object())
        return Response(self._read(experiment))

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

    def create(self, request: Request) -> Response:
        data = validated(ServeDeploymentCreateSerializer, request.data)
        workspace, cluster = self._cluster(data)
        job_id = data.pop("checkpoint_job", None)
        job = None
        if job_id is not None:
            job = TrainingJob.objects.filter(pk=job_id, workspace=workspace).first()
            if job is None:
                raise exceptions.ValidationError({"checkpoint_job": ["No such training job in this workspace."]})
        deployment = services.serve_deployment_create(
            actor=request.user, workspace=workspace, ray_cluster=cluster, checkpoint_job=job, **data
        )
        return Response(self._read(deployment), status=201)

    @action(detail=True, methods=["post"])
    def stop(self, request: Request, pk: str | None = None) -> Response:
        """Delete the Serve application from the cluster."""
        deployment = services.serve_deployment_stop(actor=request.user, deployment=self.get_object())
        return Response(self._read(deployment))

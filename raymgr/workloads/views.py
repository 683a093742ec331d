"""Ray pages for workloads: Training, Tune, Model Serving (list, new, detail, actions) and dashboard cards."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from cleverthis.tenancy.permissions import can_operate
from fleet.exceptions import IllegalTransition
from raymgr.models import RayNodeStatus
from raymgr.workloads import forms as wforms
from raymgr.workloads import health, selectors, services


def cards_context(user: Any) -> dict[str, Any]:
    """What the dashboard's four cards show."""
    return {"cards": selectors.dashboard_counts(user=user)}


@login_required
def dashboard_cards(request: HttpRequest) -> HttpResponse:
    """The cards partial the dashboard re-fetches every 30 s (htmx)."""
    return render(request, "raymgr/workloads/_cards.html", cards_context(request.user))


def _create(
    request: HttpRequest,
    form_class: type[forms.Form],
    service: Callable[..., Any],
    *,
    title: str,
    detail: str,
    prepare: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> HttpResponse:
    form = form_class(request.POST or None, user=request.user, initial=request.GET.dict())
    if request.method == "POST" and not form.fields["ray_cluster"].queryset.exists():
        raise PermissionDenied("Only workspace Owners and Admins can run Ray workloads.")
    if request.method == "POST" and form.is_valid():
        data = {k: v for k, v in form.cleaned_data.items() if v is not None and v != ""}
        cluster = data.pop("ray_cluster")
        if prepare is not None:
            data = prepare(data)
        try:
            row = service(actor=request.user, workspace=cluster.workspace, ray_cluster=cluster, **data)
        except ValidationError as exc:
            for field, errors in exc.message_dict.items():
                form.add_error(field if field in form.fields else None, errors)
        else:
            messages.success(request, f"{row.name} created ({row.get_status_display()}).")
            return redirect(detail, pk=row.pk)
    return render(request, "raymgr/workloads/form.html", {"form": form, "title": title})


def _hints(row: Any) -> list[health.Hint]:
    hints = health.job_hints(
        status=row.status,
        queue_reason=getattr(row, "queue_reason", "") or row.failure_reason,
        submitted_at=row.submitted_at,
        created_at=row.created_at,
        finished_at=row.finished_at,
        traceback=row.traceback,
        failure_reason=row.failure_reason,
        cluster_status=row.ray_cluster.last_status,
        now=timezone.now(),
    )
    cluster = row.ray_cluster
    workers = cluster.ray_nodes.filter(role="worker", status__in=RayNodeStatus.live()).count()
    if row.status in ("queued", "running"):
        hints += health.cluster_hints(
            cluster_status=cluster.last_status, live_workers=workers, max_workers=cluster.max_workers
        )
    return hints


def _act(request: HttpRequest, fn: Callable[[], Any], back: str, pk: Any) -> HttpResponse:
    try:
        fn()
    except IllegalTransition as exc:
        messages.error(request, str(exc))
        return HttpResponse(str(exc), status=409) if request.htmx else redirect(back, pk=pk)
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
    return redirect(back, pk=pk)


# ---- Training


@login_required
def training_list(request: HttpRequest) -> HttpResponse:
    """Ray → Training."""
    jobs = list(selectors.training_job_list(user=request.user)[:200])
    return render(request, "raymgr/workloads/training_list.html", {"jobs": jobs})


@login_required
def training_create(request: HttpRequest) -> HttpResponse:
    """Ray → Training → New."""
    return _create(
        request,
        wforms.TrainingJobForm,
        services.training_job_create,
        title="New training job",
        detail="raymgr:training_detail",
    )


@login_required
def training_detail(request: HttpRequest, pk: Any) -> HttpResponse:
    """A training job: status, logs, traceback, checkpoints (serve one), troubleshooting."""
    job = get_object_or_404(selectors.training_job_list(user=request.user), pk=pk)
    context = {"job": job, "hints": _hints(job), "can_operate": can_operate(request.user, job.workspace)}
    return render(request, "raymgr/workloads/training_detail.html", context)


@login_required
@require_POST
def training_cancel(request: HttpRequest, pk: Any) -> HttpResponse:
    """Cancel a queued or running job."""
    job = get_object_or_404(selectors.training_job_list(user=request.user), pk=pk)
    return _act(
        request, lambda: services.training_job_cancel(actor=request.user, job=job), "raymgr:training_detail", pk
    )


# ---- Tune


@login_required
def tune_list(request: HttpRequest) -> HttpResponse:
    """Ray → Tune."""
    experiments = list(selectors.tune_experiment_list(user=request.user)[:200])
    return render(request, "raymgr/workloads/tune_list.html", {"experiments": experiments})


@login_required
def tune_create(request: HttpRequest) -> HttpResponse:
    """Ray → Tune → New."""
    return _create(
        request,
        wforms.TuneExperimentForm,
        services.tune_experiment_create,
        title="New Tune experiment",
        detail="raymgr:tune_detail",
    )


@login_required
def tune_detail(request: HttpRequest, pk: Any) -> HttpResponse:
    """A Tune experiment: trial table with progress, best config, Train with best config."""
    experiment = get_object_or_404(selectors.tune_experiment_list(user=request.user), pk=pk)
    trials = list(experiment.trials.all())
    context = {
        "experiment": experiment,
        "trials": trials,
        "hints": _hints(experiment),
        "can_operate": can_operate(request.user, experiment.workspace),
    }
    return render(request, "raymgr/workloads/tune_detail.html", context)


@login_required
@require_POST
def tune_cancel(request: HttpRequest, pk: Any) -> HttpResponse:
    """Cancel the experiment."""
    experiment = get_object_or_404(selectors.tune_experiment_list(user=request.user), pk=pk)
    return _act(
        request,
        lambda: services.tune_experiment_cancel(actor=request.user, experiment=experiment),
        "raymgr:tune_detail",
        pk,
    )


@login_required
@require_POST
def tune_train(request: HttpRequest, pk: Any) -> HttpResponse:
    """Train with best config → a new training job (its page)."""
    experiment = get_object_or_404(selectors.tune_experiment_list(user=request.user), pk=pk)
    name = request.POST.get("name") or f"{experiment.name}-best"
    try:
        job = services.tune_train_with_best(actor=request.user, experiment=experiment, name=name)
    except IllegalTransition as exc:
        messages.error(request, str(exc))
        return HttpResponse(str(exc), status=409) if request.htmx else redirect("raymgr:tune_detail", pk=pk)
    except ValidationError as exc:
        messages.error(request, "; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items()))
        return redirect("raymgr:tune_detail", pk=pk)
    messages.success(request, f"Training job {job.name} created with the best config.")
    return redirect("raymgr:training_detail", pk=job.pk)


# ---- Serving


@login_required
def serve_list(request: HttpRequest) -> HttpResponse:
    """Ray → Model Serving."""
    deployments = list(selectors.serve_deployment_list(user=request.user)[:200])
    return render(request, "raymgr/workloads/serve_list.html", {"deployments": deployments})


@login_required
def serve_create(request: HttpRequest) -> HttpResponse:
    """Ray → Model Serving → New (?checkpoint_job= preselects a training job's checkpoint)."""
    return _create(
        request,
        wforms.ServeDeploymentForm,
        services.serve_deployment_create,
        title="New Serve deployment",
        detail="raymgr:serve_detail",
    )


@login_required
def serve_detail(request: HttpRequest, pk: Any) -> HttpResponse:
    """A Serve deployment: status, replicas, replica logs, endpoint URL."""
    deployment = get_object_or_404(selectors.serve_deployment_list(user=request.user), pk=pk)
    status = deployment.last_status or {}
    context = {
        "deployment": deployment,
        "deployments": (status.get("deployments") or {}),
        "can_operate": can_operate(request.user, deployment.workspace),
    }
    return render(request, "raymgr/workloads/serve_detail.html", context)


@login_required
@require_POST
def serve_stop(request: HttpRequest, pk: Any) -> HttpResponse:
    """Delete the Serve application."""
    deployment = get_object_or_404(selectors.serve_deployment_list(user=request.user), pk=pk)
    return _act(
        request,
        lambda: services.serve_deployment_stop(actor=request.user, deployment=deployment),
        "raymgr:serve_detail",
        pk,
    )

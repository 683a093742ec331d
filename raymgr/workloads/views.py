"""Ray pages for workloads: Training, Tune, Model Serving (list, new, detail, stop) and dashboard cards.

The three kinds share one set of views; what differs between them is data (`WorkloadPages`), and
`urls_for` gives each kind its routes under the names the templates use (`raymgr:training_list`, …).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import URLPattern, path
from django.utils import timezone
from django.views.decorators.http import require_POST

from fleet import live
from kernel.exceptions import IllegalTransition
from raymgr.models import RayNodeStatus
from raymgr.workloads import forms as wforms
from raymgr.workloads import health, selectors, services
from raymgr.workloads.models import JobStatus, ServeStatus
from tenancy.models import Role
from tenancy.permissions import can_edit
from tenancy.selectors import workspace_ids

SERVE_CHANGING = selectors.SERVE_CHANGING  # a deployment whose status changes by the second


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
    if not workspace_ids(user=request.user, roles=Role.editors()).exists():
        raise PermissionDenied("Only workspace Owners, Admins and Members can run Ray workloads.")
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
            messages.success(request, f"{row.name} created.")  # its page shows the status, live
            return redirect(detail, pk=row.pk)
    return render(request, "raymgr/workloads/form.html", {"form": form, "title": title})


def _hints(row: Any) -> list[health.Hint]:
    hints = health.row_job_hints(row, now=timezone.now())
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


# ---- One generic set of views for the three kinds


@dataclass(frozen=True)
class WorkloadPages:
    """What the pages of one kind of workload need; everything else is shared."""

    name: str  # URL segment prefix of the route names: "<name>_list", "<name>_detail", …
    url: str  # URL segment: "training/", "tune/", "serving/"
    select: Callable[..., Any]  # selector(user=) → the user's rows
    form: type[forms.Form]
    create: Callable[..., Any]  # service(actor=, workspace=, ray_cluster=, **fields) → row
    stop: Callable[[Any, Any], Any]  # (actor, row) → row: the kind's cancel / stop service
    stop_action: str  # "cancel" or "stop": the route and the button
    new_title: str
    list_template: str
    list_key: str  # the template's name for the rows
    detail_template: str
    detail_key: str  # the template's name for the row
    detail_extra: Callable[[Any], dict[str, Any]] = field(default=lambda row: {"hints": _hints(row)})
    # how often the detail page polls for this row's state (None: settled)
    live_every: Callable[[Any], int | None] = field(
        default=lambda row: live.poll_every(changing=row.status in JobStatus.active())
    )

    @property
    def rows_template(self) -> str:
        """The list page's live part: its table."""
        return f"raymgr/workloads/_{self.name}_rows.html"

    @property
    def body_template(self) -> str:
        """The detail page's live part (everything under the title bar), re-rendered for each poll."""
        return f"raymgr/workloads/_{self.name}_body.html"


def _list(kind: WorkloadPages) -> Callable[[HttpRequest], HttpResponse]:
    @login_required
    def view(request: HttpRequest) -> HttpResponse:
        rows = selectors.with_queue_positions(list(kind.select(user=request.user)[:200]))
        every = min((e for e in map(kind.live_every, rows) if e), default=None)  # the fastest a row needs
        context = {kind.list_key: rows, "live_every": every}
        if request.htmx:
            return live.respond(request, kind.rows_template, context, element_id="workload-rows", every=every)
        can_create = workspace_ids(user=request.user, roles=Role.editors()).exists()
        return render(request, kind.list_template, context | {"can_create": can_create})

    view.__doc__ = f"Ray → {kind.name}: the list (its rows update themselves while one is in progress)."
    return view


def _new(kind: WorkloadPages) -> Callable[[HttpRequest], HttpResponse]:
    @login_required
    def view(request: HttpRequest) -> HttpResponse:
        return _create(request, kind.form, kind.create, title=kind.new_title, detail=f"raymgr:{kind.name}_detail")

    view.__doc__ = f"Ray → {kind.name} → New."
    return view


def _detail(kind: WorkloadPages) -> Callable[..., HttpResponse]:
    @login_required
    def view(request: HttpRequest, pk: Any) -> HttpResponse:
        row = get_object_or_404(kind.select(user=request.user), pk=pk)
        selectors.with_queue_positions([row])
        context = {kind.detail_key: row, "can_manage": can_edit(request.user, row.workspace)}
        context |= kind.detail_extra(row)
        every = kind.live_every(row)
        if request.htmx:
            return live.respond(request, kind.body_template, context, element_id="workload-live", every=every)
        return render(request, kind.detail_template, context | {"live_every": every})

    view.__doc__ = f"One {kind.name} row: status, logs, troubleshooting (updates itself until it settles)."
    return view


def _stop(kind: WorkloadPages) -> Callable[..., HttpResponse]:
    @login_required
    @require_POST
    def view(request: HttpRequest, pk: Any) -> HttpResponse:
        row = get_object_or_404(kind.select(user=request.user), pk=pk)
        return _act(request, lambda: kind.stop(request.user, row), f"raymgr:{kind.name}_detail", pk)

    view.__doc__ = f"{kind.stop_action.capitalize()} one {kind.name} row."
    return view


def urls_for(kind: WorkloadPages) -> list[URLPattern]:
    """The kind's list, new, detail and stop routes, named `<name>_list` etc."""
    return [
        path(kind.url, _list(kind), name=f"{kind.name}_list"),
        path(f"{kind.url}new/", _new(kind), name=f"{kind.name}_create"),
        path(f"{kind.url}<uuid:pk>/", _detail(kind), name=f"{kind.name}_detail"),
        path(f"{kind.url}<uuid:pk>/{kind.stop_action}/", _stop(kind), name=f"{kind.name}_{kind.stop_action}"),
    ]


TRAINING = WorkloadPages(
    name="training",
    url="training/",
    select=selectors.training_job_list,
    form=wforms.TrainingJobForm,
    create=services.training_job_create,
    stop=lambda actor, job: services.training_job_cancel(actor=actor, job=job),
    stop_action="cancel",
    new_title="New training job",
    list_template="raymgr/workloads/training_list.html",
    list_key="jobs",
    detail_template="raymgr/workloads/training_detail.html",
    detail_key="job",
)
TUNE = WorkloadPages(
    name="tune",
    url="tune/",
    select=selectors.tune_experiment_list,
    form=wforms.TuneExperimentForm,
    create=services.tune_experiment_create,
    stop=lambda actor, experiment: services.tune_experiment_cancel(actor=actor, experiment=experiment),
    stop_action="cancel",
    new_title="New Tune experiment",
    list_template="raymgr/workloads/tune_list.html",
    list_key="experiments",
    detail_template="raymgr/workloads/tune_detail.html",
    detail_key="experiment",
    detail_extra=lambda experiment: {"trials": list(experiment.trials.all()), "hints": _hints(experiment)},
)
SERVE = WorkloadPages(
    name="serve",
    url="serving/",
    select=selectors.serve_deployment_list,
    form=wforms.ServeDeploymentForm,  # ?checkpoint_job= preselects a training job's checkpoint
    create=services.serve_deployment_create,
    stop=lambda actor, deployment: services.serve_deployment_stop(actor=actor, deployment=deployment),
    stop_action="stop",
    new_title="New Serve deployment",
    list_template="raymgr/workloads/serve_list.html",
    list_key="deployments",
    detail_template="raymgr/workloads/serve_detail.html",
    detail_key="deployment",
    detail_extra=lambda deployment: {"deployments": (deployment.last_status or {}).get("deployments") or {}},
    live_every=lambda deployment: live.poll_every(
        changing=deployment.status in SERVE_CHANGING, watched=deployment.status in ServeStatus.live()
    ),
)


# ---- Tune's own action


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

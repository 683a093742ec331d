"""Pages of the model catalog (`/compute/models/`: search, size for a context and batch, where each model fits,
Deploy, private models) and of a node's model cache (the node page's partial: what is cached, last use, disk
free, budget, downloads with bytes and rate, polled while one runs; Evict; the budget)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from fleet.models import ComputeCluster, Node
from fleet.workloads import catalog_fit, model_cache
from fleet.workloads import services as workload_services
from fleet.workloads.catalog import MAX_NAME
from fleet.workloads.models import NodeModel
from kernel.exceptions import IllegalTransition
from tenancy.permissions import can_operate
from tenancy.selectors import workspace_ids, workspace_list


class CatalogQueryForm(forms.Form):
    """The Models page's filters (bad values: the defaults, with the field's message)."""

    search = forms.CharField(max_length=200, required=False)
    context = forms.IntegerField(
        min_value=1, max_value=catalog_fit.MAX_CONTEXT, required=False, label="Context (tokens)"
    )
    batch = forms.IntegerField(min_value=1, max_value=catalog_fit.MAX_BATCH, required=False, label="Batch")
    quantization = forms.CharField(max_length=32, required=False)
    fits = forms.BooleanField(required=False, label="Only what fits")
    cluster = forms.ModelChoiceField(queryset=ComputeCluster.objects.none(), required=False)


class PrivateModelForm(forms.Form):
    """A private model of a workspace: a Hub repository and revision, or a folder on the nodes, and its size."""

    workspace = forms.ModelChoiceField(queryset=None)  # type: ignore[arg-type]
    name = forms.CharField(max_length=MAX_NAME)
    model_id = forms.CharField(max_length=200, required=False, label="Hub repository", help_text="owner/name")
    revision = forms.CharField(max_length=200, initial="main")
    local_path = forms.CharField(max_length=1000, required=False, help_text="Or an absolute folder on the nodes.")
    params_b = forms.FloatField(min_value=0.000001, max_value=2000, label="Parameters (billions)")
    context_length = forms.IntegerField(min_value=0, max_value=catalog_fit.MAX_CONTEXT, required=False)
    layers = forms.IntegerField(min_value=0, max_value=1000, required=False)
    kv_heads = forms.IntegerField(min_value=0, max_value=1000, required=False, label="KV heads")
    head_dim = forms.IntegerField(min_value=0, max_value=4096, required=False, label="Head size")

    def __init__(self, *args: Any, user: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["workspace"].queryset = workspace_list(user=user)


@login_required
def catalog_page(request: HttpRequest) -> HttpResponse:
    """The Models page: every catalog model sized for the asked context and batch, the nodes that can hold it
    (those with the weights first) and Deploy, which opens the cluster's endpoint form pre-filled."""
    query = CatalogQueryForm(request.GET or None)
    query.fields["cluster"].queryset = ComputeCluster.objects.filter(workspace__in=workspace_ids(user=request.user))
    values = query.cleaned_data if query.is_bound and query.is_valid() else {}
    models = list(catalog_fit.catalog_list(user=request.user, search=values.get("search") or ""))
    cluster = values.get("cluster")
    rows = catalog_fit.catalog_rows(
        user=request.user,
        models=models,
        context=values.get("context"),
        batch=values.get("batch") or 1,
        quantization=values.get("quantization") or None,
        cluster_id=cluster.pk if cluster else None,
    )
    if values.get("fits"):
        rows = [r for r in rows if r.fitting]
    operable = [w for w in workspace_list(user=request.user) if can_operate(request.user, w)]
    context = {
        "query": query,
        "rows": [{"row": r, "fitting": [(n, r.deploy_url(n)) for n in r.fitting]} for r in rows],
        "curated_count": sum(1 for m in models if m.curated),
        "private_form": PrivateModelForm(user=request.user) if operable else None,
        "operable_ids": {w.pk for w in operable},
    }
    return render(request, "workloads/catalog.html", context)


@login_required
@require_POST
def catalog_private_create(request: HttpRequest) -> HttpResponse:
    """Add a private model (Owner/Admin of its workspace)."""
    form = PrivateModelForm(request.POST, user=request.user)
    if form.is_valid():
        values = {k: v for k, v in form.cleaned_data.items() if k != "workspace"}
        try:
            model = workload_services.catalog_private_create(
                actor=request.user, workspace=form.cleaned_data["workspace"], values=values
            )
        except ValidationError as exc:
            messages.error(request, " ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items()))
            return redirect("workloads:catalog")
        messages.success(request, f"Model {model.name} added to {model.workspace.name}'s catalog.")
    else:
        messages.error(request, " ".join(f"{k}: {' '.join(v)}" for k, v in form.errors.items()))
    return redirect("workloads:catalog")


@login_required
@require_POST
def catalog_private_delete(request: HttpRequest, pk: Any) -> HttpResponse:
    """Remove a private model (Owner/Admin)."""
    model = get_object_or_404(catalog_fit.catalog_list(user=request.user), pk=pk)
    try:
        workload_services.catalog_private_delete(actor=request.user, model=model)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    else:
        messages.success(request, f"Model {model.name} removed.")
    return redirect("workloads:catalog")


def _node(request: HttpRequest, pk: Any) -> Node:
    return get_object_or_404(
        Node.objects.select_related("cluster__workspace"),
        pk=pk,
        cluster__workspace__in=workspace_ids(user=request.user),
    )


@login_required
def node_cache(request: HttpRequest, pk: Any) -> HttpResponse:
    """The node page's model cache (htmx partial): polled every 2 s while a download runs (286 stops it)."""
    node = _node(request, pk)
    (view,) = model_cache.node_caches([node])
    context = {"cache": view, "node": node, "can_operate": can_operate(request.user, node.cluster.workspace)}
    response = render(request, "workloads/_node_cache.html", context)
    if request.htmx and request.GET.get("poll") and not view.downloads:
        response.status_code = 286  # the download ended: this answer is the last poll
    return response


@login_required
@require_POST
def node_cache_evict(request: HttpRequest, pk: Any) -> HttpResponse:
    """Evict one snapshot (Owner/Admin; refused while an endpoint serves from it)."""
    cached = get_object_or_404(
        NodeModel.objects.select_related("node__cluster__workspace"),
        pk=pk,
        node__cluster__workspace__in=workspace_ids(user=request.user),
    )
    try:
        workload_services.node_model_evict(actor=request.user, cached=cached)
    except (IllegalTransition, ValidationError) as exc:
        messages.error(request, str(exc) if isinstance(exc, IllegalTransition) else " ".join(exc.messages))
    except PermissionDenied as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Evicting {cached.model_id}@{cached.revision} from {cached.node.name}.")
    return redirect("fleet:node_detail", pk=cached.node_id)


@login_required
@require_POST
def node_cache_budget(request: HttpRequest, pk: Any) -> HttpResponse:
    """Set the node's cache budget in MiB (Owner/Admin; 0 or empty: none)."""
    node = _node(request, pk)
    raw = (request.POST.get("budget_mb") or "0").strip()
    try:
        workload_services.node_cache_set_budget(
            actor=request.user, node=node, budget_mb=int(raw) if raw.isdigit() else -1
        )
    except (ValidationError, PermissionDenied) as exc:
        messages.error(request, " ".join(exc.messages) if isinstance(exc, ValidationError) else str(exc))
    else:
        messages.success(request, "Cache budget saved: the agent applies it with the next download.")
    return redirect("fleet:node_detail", pk=node.pk)

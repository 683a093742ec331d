"""Settings → Namespaces: list, create, bind to a compute cluster, delete (writes through the services).

Bad input answers 400 with the form's field messages; members who may not operate get 403.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from fleet import selectors, services
from fleet.forms import NamespaceBindForm, NamespaceForm, apply_service_errors
from tenancy.models import Role
from tenancy.selectors import workspace_ids, workspace_list


def _context(request: HttpRequest, form: NamespaceForm | None = None, **extra: Any) -> dict[str, Any]:
    operable = list(
        workspace_list(user=request.user).filter(pk__in=workspace_ids(user=request.user, roles=Role.operators()))
    )
    clusters = list(selectors.cluster_list(user=request.user).filter(workspace__in=[w.pk for w in operable]))
    if form is None and operable:
        form = NamespaceForm(workspaces=operable, clusters=clusters)
    operable_ids = {w.pk for w in operable}
    namespaces = list(selectors.namespace_list(user=request.user))
    for ns in namespaces:
        ns.can_operate = ns.workspace_id in operable_ids
        ns.cluster_choices = [c for c in clusters if c.workspace_id == ns.workspace_id]
    return {"namespaces": namespaces, "form": form, "operable": operable, "clusters": clusters, **extra}


@login_required
@require_http_methods(["GET", "POST"])
def namespace_list(request: HttpRequest) -> HttpResponse:
    """The user's namespaces and (Owner/Admin) the form to create one."""
    if request.method == "GET":
        return render(request, "fleet/namespace_list.html", _context(request))
    context = _context(request)
    if not context["operable"]:
        raise PermissionDenied("Only workspace Owners and Admins can create namespaces.")
    form = NamespaceForm(request.POST, workspaces=context["operable"], clusters=context["clusters"])
    if form.is_valid():
        workspace = next(w for w in context["operable"] if str(w.pk) == form.cleaned_data["workspace"])
        try:
            namespace = services.namespace_create(
                actor=request.user,
                workspace=workspace,
                name=form.cleaned_data["name"],
                cluster_id=form.cleaned_data["cluster"] or None,
            )
        except ValidationError as exc:
            apply_service_errors(form, exc)
        else:
            messages.success(request, f"Namespace {namespace.name} created.")
            return redirect("fleet:namespace_list")
    return render(request, "fleet/namespace_list.html", {**context, "form": form}, status=400)


def _namespace(request: HttpRequest, pk: Any) -> Any:
    return get_object_or_404(selectors.namespace_list(user=request.user), pk=pk)


@login_required
@require_POST
def namespace_bind(request: HttpRequest, pk: Any) -> HttpResponse:
    """Bind the namespace to a compute cluster of its workspace, or unbind it."""
    namespace = _namespace(request, pk)
    form = NamespaceBindForm(request.POST)
    error = ""
    if form.is_valid():
        try:
            services.namespace_bind(actor=request.user, namespace=namespace, cluster_id=form.cleaned_data["cluster"])
        except ValidationError as exc:
            error = "; ".join(m for ms in exc.message_dict.values() for m in ms)
        else:
            target = namespace.cluster.name if namespace.cluster else "no compute cluster"
            messages.success(request, f"Namespace {namespace.name} is bound to {target}.")
            return redirect("fleet:namespace_list")
    else:
        error = "; ".join(m for ms in form.errors.values() for m in ms)
    return render(request, "fleet/namespace_list.html", _context(request, error=error), status=400)


@login_required
@require_POST
def namespace_delete(request: HttpRequest, pk: Any) -> HttpResponse:
    """Delete the namespace (after the page's confirm)."""
    namespace = _namespace(request, pk)
    services.namespace_delete(actor=request.user, namespace=namespace)
    messages.success(request, f"Namespace {namespace.name} deleted.")
    return redirect("fleet:namespace_list")

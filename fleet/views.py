"""Compute pages: cluster list/create, cluster tabs (Nodes, Commands), node detail with event log.

Each view renders its full page, or only its partial for htmx requests. Writes go through the
services; their errors become 400 (form errors), 403 or 409 with the message shown.
"""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST

from fleet import agent_updates, agent_views, live, metrics_history, selectors, services
from fleet.filters import COMMAND_FILTERS, NODE_FILTERS
from fleet.forms import (
    COMMAND_FORMS,
    ClusterForm,
    ClusterSettingsForm,
    EndpointStartForm,
    RenameForm,
    TargetForm,
    apply_service_errors,
)
from fleet.models import CommandStatus, CommandType, ComputeCluster, Node, NodeStatus
from fleet.workloads.models import NodeModel
from kernel.exceptions import IllegalTransition
from tenancy.models import Role
from tenancy.permissions import can_operate
from tenancy.selectors import workspace_list

NODE_ACTIONS = {
    "cordon": services.node_cordon,
    "uncordon": services.node_uncordon,
    "drain": services.node_drain,
}


def _cluster(request: HttpRequest, pk: Any) -> ComputeCluster:
    return get_object_or_404(selectors.cluster_list(user=request.user), pk=pk)


def _node(request: HttpRequest, pk: Any) -> Node:
    return get_object_or_404(selectors.node_list(user=request.user), pk=pk)


def _operable_workspaces(request: HttpRequest) -> Any:
    return workspace_list(user=request.user).filter(
        memberships__user=request.user, memberships__role__in=Role.operators()
    )


@login_required
@require_http_methods(["GET", "POST"])
def cluster_list(request: HttpRequest) -> HttpResponse:
    """Settings → Compute: the user's compute clusters and the form to create one."""
    workspaces = list(_operable_workspaces(request))
    form = ClusterForm(request.POST or None, workspaces=workspaces)
    status = 200
    if request.method == "POST":
        if not workspaces:
            raise PermissionDenied("Only workspace Owners and Admins can create clusters.")
        if form.is_valid():
            data = dict(form.cleaned_data)
            workspace = next(w for w in workspaces if str(w.pk) == data.pop("workspace"))
            try:
                cluster = services.cluster_create(actor=request.user, workspace=workspace, **data)
            except ValidationError as exc:
                apply_service_errors(form, exc)
            else:
                messages.success(request, f"Cluster {cluster.name} created.")
                return redirect("fleet:cluster_detail", pk=cluster.pk)
        status = 400
    context = {"clusters": selectors.cluster_list(user=request.user), "form": form if workspaces else None}
    return render(request, "fleet/cluster_list.html", context, status=status)


def _nodes_context(request: HttpRequest, cluster: ComputeCluster, **extra: Any) -> dict[str, Any]:
    nodes = selectors.node_list(user=request.user, cluster=cluster)
    filter_error = ""
    try:
        nodes = NODE_FILTERS.apply(nodes, request.GET)
    except ValidationError as exc:
        filter_error = "; ".join(f"{k}: {', '.join(v)}" for k, v in exc.message_dict.items())
    nodes = list(nodes)
    sparks = metrics_history.history(n.pk for n in nodes)  # one Redis round trip, no query
    for n in nodes:
        n.spark = sparks.get(str(n.pk), {})
    return {
        "cluster": cluster,
        "nodes": nodes,
        # 3 s while a node drains, else every 30 s (heartbeats; a node may go offline at any time)
        "live_every": live.poll_every(changing=any(n.status == NodeStatus.DRAINING for n in nodes), watched=True),
        "nodes_url": (
            request.get_full_path() if request.method == "GET" else reverse("fleet:cluster_nodes", args=[cluster.pk])
        ),
        "filter_error": filter_error,
        "can_operate": can_operate(request.user, cluster.workspace),
        "tab": "nodes",
        **extra,
    }


@login_required
def cluster_detail(request: HttpRequest, pk: Any) -> HttpResponse:
    """A cluster opens on its Nodes tab."""
    return redirect("fleet:cluster_nodes", pk=_cluster(request, pk).pk)


@login_required
def cluster_nodes(request: HttpRequest, pk: Any) -> HttpResponse:
    """Nodes tab (htmx: just the `_nodes.html` table, which polls itself every 30 s)."""
    cluster = _cluster(request, pk)
    context = _nodes_context(request, cluster)
    template = "fleet/_nodes.html" if request.htmx else "fleet/cluster_nodes.html"
    return render(request, template, context, status=400 if context["filter_error"] else 200)


@login_required
@require_POST
def node_action(request: HttpRequest, pk: Any, action: str) -> HttpResponse:
    """Cordon / uncordon / drain / delete a node; htmx gets the refreshed Nodes table back."""
    node = _node(request, pk)
    cluster = node.cluster
    status, error = 200, ""
    try:
        if action == "delete":
            services.node_delete(node=node, actor=request.user)
            done = f"Node {node.name} deleted; its certificate is revoked."
        elif action == "update-agent":
            command = agent_updates.node_update_agent(node=node, actor=request.user)
            done = f"Agent update of {node.name} to {command.payload['version']} sent; see its event log."
        elif action in NODE_ACTIONS:
            node = NODE_ACTIONS[action](node=node, actor=request.user)
            done = f"Node {node.name} is now {node.status}."
        else:
            raise Http404("Unknown node action.")
    except IllegalTransition as exc:
        status, error = 409, str(exc)
    except PermissionDenied as exc:
        status, error = 403, str(exc) or "Only workspace Owners and Admins can do this."
    if request.htmx:
        context = _nodes_context(request, cluster, error=error, notice="" if error else done)
        return render(request, "fleet/_nodes.html", context, status=status)
    if error:
        messages.error(request, error)
        return render(request, "fleet/cluster_nodes.html", _nodes_context(request, cluster, error=error), status=status)
    messages.success(request, done)
    if action == "delete":
        return redirect("fleet:cluster_nodes", pk=cluster.pk)
    return redirect(_next_or(request, reverse("fleet:cluster_nodes", args=[cluster.pk])))


def _next_or(request: HttpRequest, default: str) -> str:
    """The posted `next` when it stays on this host (never an off-site redirect), else `default`."""
    target = request.POST.get("next", "")
    safe = url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    )
    return target if safe else default


COMMANDS_PER_PAGE = 25


def _remembered_key(cluster: ComputeCluster) -> str:
    return f"commands:last-sent:{cluster.pk}"


def _command_forms(
    request: HttpRequest, cluster: ComputeCluster, data: Any = None, *, chosen: str = ""
) -> tuple[TargetForm, Any, str]:
    """The send form: bound to `data`, else preset to the `chosen` type, else to the command type and
    target this user sent last on this cluster (the page's `?send=<type>` presets the type; its
    `?command_type=` filters the list)."""
    nodes = list(selectors.node_list(user=request.user, cluster=cluster))
    last = request.session.get(_remembered_key(cluster), {}) if data is None else {}
    chosen = data.get("command_type", "") if data is not None else chosen
    command_type = chosen or last.get("command_type") or CommandType.CONTAINER_CREATE
    if command_type not in COMMAND_FORMS:
        command_type = CommandType.CONTAINER_CREATE
    initial = {"command_type": command_type}
    if last.get("target") in {"all", *(str(n.pk) for n in nodes)}:
        initial["target"] = last["target"]
    target = TargetForm(data, nodes=nodes, initial=initial)
    extra: dict[str, Any] = {}
    if command_type == CommandType.ENDPOINT_START:
        cached: dict[str, list[str]] = {}
        for model_id, node_name in (
            NodeModel.objects.filter(node__in=nodes).order_by("node__name").values_list("model_id", "node__name")
        ):
            cached.setdefault(model_id, []).append(node_name)
        extra["cached"] = {m: sorted(set(names)) for m, names in cached.items()}
    payload_form = COMMAND_FORMS[command_type](data, prefix="p", **extra)
    return target, payload_form, command_type


def _command_rows(request: HttpRequest, cluster: ComputeCluster) -> dict[str, Any]:
    """Recent commands, filtered (node, type, status, by) and paged; the control plane's own hidden
    unless `show_system=1` (or `by=system`). Polls while a command on the page is unfinished."""
    params = request.GET
    commands = selectors.command_list(user=request.user, cluster=cluster)
    filter_error = ""
    try:
        commands = COMMAND_FILTERS.apply(commands, params)
    except ValidationError as exc:
        filter_error = "; ".join(f"{k}: {', '.join(v)}" for k, v in exc.message_dict.items())
        commands = commands.none()
    show_system = params.get("show_system") == "1" or params.get("by") == "system"
    if not show_system:
        commands = commands.filter(system=False)
    page = Paginator(commands, COMMANDS_PER_PAGE).get_page(params.get("page"))
    rows = list(page.object_list)
    query = params.copy()
    query.pop("page", None)
    return {
        "commands": rows,
        "page": page,
        "page_query": query.urlencode(),
        "filters": params,
        "show_system": show_system,
        "filter_error": filter_error,
        "commands_url": request.get_full_path(),
        "live_every": live.poll_every(changing=any(not c.finished for c in rows)),
    }


def _commands_context(request: HttpRequest, cluster: ComputeCluster, **extra: Any) -> dict[str, Any]:
    context = {
        "cluster": cluster,
        "can_operate": can_operate(request.user, cluster.workspace),
        "tab": "commands",
        "senders": sorted(m.user.get_username() for m in cluster.workspace.memberships.select_related("user")),
        "command_types": CommandType.values,
        "command_statuses": CommandStatus.choices,
        **_command_rows(request, cluster),
    }
    if "target_form" not in extra:
        target, payload_form, command_type = _command_forms(request, cluster)
        extra.update(target_form=target, payload_form=payload_form, command_type=command_type)
    context.update(extra)
    return context


@login_required
@require_http_methods(["GET", "POST"])
def cluster_commands(request: HttpRequest, pk: Any) -> HttpResponse:
    """Commands tab: send a command (Owner/Admin) and see the cluster's recent commands.

    htmx gets only the Recent commands table, which polls itself while a command on it is unfinished.
    """
    cluster = _cluster(request, pk)
    if request.method == "GET":
        if request.htmx:
            rows = {"cluster": cluster, **_command_rows(request, cluster)}
            status = 400 if rows["filter_error"] else 200
            return live.respond(
                request, "fleet/_commands.html", rows, element_id="commands", every=rows["live_every"], status=status
            )
        target, payload_form, command_type = _command_forms(request, cluster, chosen=request.GET.get("send", ""))
        context = _commands_context(
            request, cluster, target_form=target, payload_form=payload_form, command_type=command_type
        )
        return render(request, "fleet/cluster_commands.html", context, status=400 if context["filter_error"] else 200)
    if not can_operate(request.user, cluster.workspace):
        raise PermissionDenied("Only workspace Owners and Admins can send commands.")
    target, payload_form, command_type = _command_forms(request, cluster, request.POST)
    status = 400
    error = ""
    valid = target.is_valid() and payload_form.is_valid()
    if valid and isinstance(payload_form, EndpointStartForm):
        valid = payload_form.check_target(target.target_node())
    if valid:
        try:
            sent = services.command_dispatch(
                actor=request.user,
                cluster=cluster,
                command_type=target.cleaned_data["command_type"],
                payload=payload_form.to_payload(),
                node=target.target_node(),
            )
        except ValidationError as exc:
            apply_service_errors(payload_form, exc)
        except IllegalTransition as exc:
            status, error = 409, str(exc)
        else:
            request.session[_remembered_key(cluster)] = {
                "command_type": command_type,
                "target": target.cleaned_data["target"],
            }
            messages.success(request, f"{command_type} queued for {len(sent)} node(s).")
            if request.htmx:
                response = HttpResponse(status=204)
                response["HX-Redirect"] = reverse("fleet:cluster_commands", args=[cluster.pk])
                return response
            return redirect("fleet:cluster_commands", pk=cluster.pk)
    context = _commands_context(
        request, cluster, target_form=target, payload_form=payload_form, command_type=command_type, error=error
    )
    return render(request, "fleet/cluster_commands.html", context, status=status)


@login_required
def command_form(request: HttpRequest, pk: Any) -> HttpResponse:
    """htmx: the payload fields for the chosen command type."""
    cluster = _cluster(request, pk)
    _, payload_form, command_type = _command_forms(request, cluster, chosen=request.GET.get("command_type", ""))
    return render(request, "fleet/_command_form.html", {"payload_form": payload_form, "command_type": command_type})


@never_cache
@login_required
@require_POST
def join_token_create(request: HttpRequest, pk: Any) -> HttpResponse:
    """Generate a join token; the dialog shows the one-line join command exactly once."""
    cluster = _cluster(request, pk)
    token, raw = services.join_token_create(cluster=cluster, actor=request.user)
    base_url = agent_views.control_plane_url(request)  # the URL the operator reached us at, unless configured
    context = {"cluster": cluster, "join_command": services.join_command(raw, base_url), "token": token}
    if request.htmx:
        return render(request, "fleet/_join_token.html", context)
    return render(request, "fleet/join_token.html", context)


@login_required
@require_POST
def cluster_resume_automation(request: HttpRequest, pk: Any) -> HttpResponse:
    """End a partition pause now (Owner/Admin); back to the Nodes tab."""
    cluster = _cluster(request, pk)
    services.cluster_resume_automation(actor=request.user, cluster=cluster)
    messages.success(request, "Automation resumed: drains and rescheduling run again.")
    return redirect("fleet:cluster_nodes", pk=cluster.pk)


def _node_live(node: Node) -> dict[str, Any]:
    """The node page's live parts (facts, event log): every 3 s while it drains or a command of it is
    unfinished, else every 30 s (its heartbeats keep changing the figures)."""
    changing = node.status == NodeStatus.DRAINING or node.commands.exclude(status__in=CommandStatus.terminal()).exists()
    base = reverse("fleet:node_detail", args=[node.pk])
    return {
        "live_every": live.poll_every(changing=changing, watched=True),
        "facts_url": f"{base}?part=facts",
        "events_url": base,
    }


def _node_context(request: HttpRequest, node: Node, rename_form: RenameForm) -> dict[str, Any]:
    cached = list(node.cached_models.order_by("model_id", "revision"))
    return {
        "node": node,
        "cluster": node.cluster,
        "events": selectors.node_event_list(node=node)[:100],
        "rename_form": rename_form,
        "can_operate": can_operate(request.user, node.cluster.workspace),
        "commands": selectors.command_list(user=request.user, node=node)[:20],
        **_node_charts(node),
        **_node_live(node),
        "cached_models": cached,
        "cache_bytes": sum(m.size_bytes for m in cached),
    }


@login_required
def node_detail(request: HttpRequest, pk: Any) -> HttpResponse:
    """A node: live facts and status, rename form, and its live event log (htmx: the log, or with
    `?part=facts` the header and facts)."""
    node = _node(request, pk)
    if request.htmx:
        context = {"node": node, **_node_live(node)}
        if request.GET.get("part") == "facts":
            return render(request, "fleet/_node_facts.html", context)
        context["events"] = selectors.node_event_list(node=node)[:100]
        return render(request, "fleet/_events.html", context)
    context = _node_context(request, node, RenameForm(initial={"name": node.name}))
    return render(request, "fleet/node_detail.html", context)


def _node_charts(node: Node) -> dict[str, Any]:
    """The node's utilization over the last hour and the last day (from Redis, no query)."""
    return {
        "history_hour": metrics_history.history([node.pk], metrics_history.HOUR)[str(node.pk)],
        "history_day": metrics_history.history([node.pk], metrics_history.DAY)[str(node.pk)],
    }


@login_required
@require_POST
def node_rename(request: HttpRequest, pk: Any) -> HttpResponse:
    """Rename a node."""
    node = _node(request, pk)
    form = RenameForm(request.POST)
    if form.is_valid():
        try:
            services.node_rename(node=node, actor=request.user, name=form.cleaned_data["name"])
        except ValidationError as exc:
            apply_service_errors(form, exc)
        else:
            messages.success(request, "Node renamed.")
            return redirect("fleet:node_detail", pk=node.pk)
    return render(request, "fleet/node_detail.html", _node_context(request, node, form), status=400)


@login_required
@require_http_methods(["GET", "POST"])
def cluster_settings(request: HttpRequest, pk: Any) -> HttpResponse:
    """Settings tab: name, description and ArgoCD settings; the mode is read-only."""
    cluster = _cluster(request, pk)
    operator = can_operate(request.user, cluster.workspace)
    initial = {f: getattr(cluster, f) for f in ("name", "description", "argocd_server", "git_repo_url", "git_branch")}
    form = ClusterSettingsForm(request.POST or None, initial=initial)
    status = 200
    if request.method == "POST":
        if not operator:
            raise PermissionDenied("Only workspace Owners and Admins can change clusters.")
        status = 400
        if form.is_valid():
            try:
                services.cluster_update(actor=request.user, cluster=cluster, **form.changes(request.POST.get("mode")))
            except ValidationError as exc:
                apply_service_errors(form, exc)
            else:
                messages.success(request, "Cluster settings saved.")
                return redirect("fleet:cluster_settings", pk=cluster.pk)
    context = {"cluster": cluster, "form": form, "can_operate": operator, "tab": "settings"}
    return render(request, "fleet/cluster_settings.html", context, status=status)

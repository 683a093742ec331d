"""Settings → Audit log: the audit trail of the user's workspaces, with filters, paging and export links.

The full page, or only the `_entries.html` partial for htmx requests (the filter form swaps it in).
"""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET

from audit.models import Outcome
from audit.selectors import AUDIT_FILTERS, audit_entry_list
from audit.services import ACTIONS, TARGET_TYPES

PAGE_SIZE = 50


@login_required
@require_GET
def entry_list(request: HttpRequest) -> HttpResponse:
    """Filter by actor, action, target type, outcome and time; 50 a page; CSV/JSON of every match."""
    filters = {name: request.GET[name] for name in AUDIT_FILTERS.filters if request.GET.get(name)}
    entries = audit_entry_list(user=request.user)
    filter_error = ""
    try:
        entries = AUDIT_FILTERS.apply(entries, filters)
    except ValidationError as exc:
        filter_error = "; ".join(f"{name}: {' '.join(messages)}" for name, messages in exc.message_dict.items())
        entries = entries.none()
    page = Paginator(entries, PAGE_SIZE).get_page(request.GET.get("page"))
    query = urlencode(filters)
    api = reverse("audit-entry-list")
    context = {
        "page": page,
        "filters": filters,
        "query": query,
        "filter_error": filter_error,
        "actions": sorted(ACTIONS),
        "target_types": sorted(TARGET_TYPES),
        "outcomes": Outcome.choices,
        "export_csv": f"{api}?{urlencode({**filters, 'format': 'csv'})}",
        "export_json": f"{api}?{urlencode({**filters, 'format': 'json'})}",
    }
    template = "audit/_entries.html" if request.htmx else "audit/entry_list.html"
    return render(request, template, context, status=400 if filter_error else 200)

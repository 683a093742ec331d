"""A refused request (a missing right, a stale or forged form) shows the product's page: the reason in words
and a link back to where the user was, never a bare "403 Forbidden"."""

from __future__ import annotations

import pytest
from django.test import Client

from fleet import services
from fleet.workloads.models import EndpointStatus
from tests.support.endpoints import endpoint_row

pytestmark = pytest.mark.django_db


@pytest.fixture
def endpoint(owner, workspace):
    cluster = services.cluster_create(actor=owner, workspace=workspace, name="prod")
    return endpoint_row(cluster=cluster, node=None, model_id="acme/tiny", status=EndpointStatus.RUNNING)


def _signed_in(user, **kwargs) -> Client:
    client = Client(**kwargs)
    client.force_login(user)
    return client


def test_a_missing_right_says_why_and_links_back(endpoint, workspace, member_of):
    viewer = _signed_in(member_of(workspace, "viewer"))
    came_from = f"http://testserver/compute/endpoints/{endpoint.pk}/"
    response = viewer.post(f"/compute/endpoints/{endpoint.pk}/stop/", HTTP_REFERER=came_from)
    assert response.status_code == 403
    page = response.content.decode()
    assert "403 Forbidden" not in page
    assert "<h1>Not allowed</h1>" in page
    assert "Only workspace Owners, Admins and Members can start or stop endpoints." in page
    assert f'<a class="button" href="{came_from}">Go back</a>' in page
    assert 'class="sidebar"' in page  # the product's page, with its navigation


def test_a_link_back_never_leaves_the_site(endpoint, workspace, member_of):
    viewer = _signed_in(member_of(workspace, "viewer"))
    page = viewer.post(f"/compute/endpoints/{endpoint.pk}/stop/", HTTP_REFERER="https://evil.example/x").content
    assert b'<a class="button" href="/">Go back</a>' in page
    assert b"evil.example" not in page


def test_a_stale_or_forged_form_says_so_and_links_back(endpoint, owner):
    browser = _signed_in(owner, enforce_csrf_checks=True)
    came_from = "http://testserver/compute/endpoints/"
    response = browser.post(f"/compute/endpoints/{endpoint.pk}/stop/", {"from": "list"}, HTTP_REFERER=came_from)
    assert response.status_code == 403
    page = response.content.decode()
    assert "403 Forbidden" not in page
    assert "CSRF cookie" not in page  # Django's developer wording stays out of the product's page
    assert "did not carry this site&#x27;s security token" in page
    assert "reload the page and send it again" in page
    assert f'href="{came_from}">Go back</a>' in page
    endpoint.refresh_from_db()
    assert endpoint.status == EndpointStatus.RUNNING  # nothing was done


def test_htmx_gets_the_reason_as_a_message_on_the_page(endpoint, workspace, member_of):
    viewer = _signed_in(member_of(workspace, "viewer"))
    response = viewer.post(f"/compute/endpoints/{endpoint.pk}/stop/", HTTP_HX_REQUEST="true")
    assert response.status_code == 403
    assert (response["HX-Retarget"], response["HX-Reswap"]) == ("main", "afterbegin")
    fragment = response.content.decode()
    assert "<html" not in fragment
    assert "Only workspace Owners, Admins and Members can start or stop endpoints." in fragment


def test_the_api_keeps_json_refusals(endpoint, workspace, member_of, api_client_for):
    response = api_client_for(member_of(workspace, "viewer")).post(f"/api/v1/endpoints/{endpoint.pk}/stop/")
    assert response.status_code == 403
    assert response.json() == {"detail": "Only workspace Owners, Admins and Members can stop endpoints."}

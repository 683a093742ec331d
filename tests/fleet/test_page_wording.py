"""Pages speak the product docs' words: Create Cluster opens the form, Orchestration mode, Command type,
Node; the join command comes in a dialog with a copy button and the one-time warning; ArgoCD fields
belong to argocd clusters only, and the "cannot be changed" hint sits with the mode field."""

from __future__ import annotations

import re

import pytest

from fleet import services

pytestmark = pytest.mark.django_db


@pytest.fixture
def browser(client, owner):
    client.force_login(owner)
    return client


def _field_div(page: str, name: str) -> str:
    found = re.search(
        rf'<div class="field field-{name}">(.*?)</div>\s*(?=<div class="field|<fieldset|<button|</fieldset)', page, re.S
    )
    assert found, name
    return found[1]


def test_create_cluster_button_opens_the_form_with_docs_labels(browser, workspace):
    page = browser.get("/compute/").content.decode()
    assert '<details class="create-panel">' in page  # closed until the button is pressed
    assert '<summary class="button">Create Cluster</summary>' in page
    mode = _field_div(page, "mode")
    assert "Orchestration mode" in mode
    assert "Cannot be changed after the cluster is created." in mode  # next to the mode select, not elsewhere
    assert mode.index("<select") < mode.index("Cannot be changed")
    assert "Cannot be changed" not in _field_div(page, "description")
    # the ArgoCD fields are grouped, shown (by CSS) only when argocd is the chosen mode
    argocd = re.search(r'<fieldset class="argocd-fields">(.*?)</fieldset>', page, re.S)[1]
    for name in ("argocd_server", "argocd_token", "git_repo_url", "git_branch"):
        assert f'name="{name}"' in argocd
    assert '<button type="submit">Create</button>' in page


def test_a_rejected_create_reopens_the_form(browser, workspace):
    response = browser.post("/compute/", {"workspace": str(workspace.pk), "name": "", "mode": "standalone"})
    assert response.status_code == 400
    assert '<details class="create-panel" open>' in response.content.decode()


def test_settings_show_argocd_fields_only_for_argocd_clusters(browser, owner, workspace, cluster):
    page = browser.get(f"/compute/clusters/{cluster.pk}/settings/").content.decode()
    assert 'name="argocd_server"' not in page
    assert "Cannot be changed after the cluster is created." in page
    gitops = services.cluster_create(
        actor=owner,
        workspace=workspace,
        name="gitops",
        mode="argocd",
        argocd_server="argocd.example",
        git_repo_url="git@example:infra.git",
    )
    page = browser.get(f"/compute/clusters/{gitops.pk}/settings/").content.decode()
    assert 'name="argocd_server"' in page
    # saving a non-argocd cluster's name leaves its (unshown) ArgoCD settings alone
    saved = browser.post(f"/compute/clusters/{cluster.pk}/settings/", {"name": "prod2", "description": ""})
    assert saved.status_code == 302
    cluster.refresh_from_db()
    assert (cluster.name, cluster.git_branch) == ("prod2", "main")


def test_commands_form_labels_follow_the_docs(browser, cluster):
    page = browser.get(f"/compute/clusters/{cluster.pk}/commands/").content.decode()
    assert "<label>Command type" in page
    assert "<label>Node" in page


def test_join_command_dialog_has_a_copy_button_and_the_one_time_warning(browser, cluster):
    body = browser.post(f"/compute/clusters/{cluster.pk}/join-tokens/", HTTP_HX_REQUEST="true").content.decode()
    assert re.search(r"<dialog class=\"join-token\" data-modal", body)
    assert '<code class="secret" id="join-command">curl -fsSL' in body
    assert 'data-copy-target="#join-command"' in body
    assert "shown <strong>only once</strong>" in body
    assert "expires" in body

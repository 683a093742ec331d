"""Live pages in a real browser: a status changed on the server shows up without a reload.

Playwright drives Debian's Chromium against a live daphne (and Celery worker). The test changes
state through the services, as the tunnel consumer does when an agent reports, and waits (bounded)
for the open page to show it; a marker set on `window` proves the page was never reloaded. Also the
Commands filters. Screenshots go to test-output/screenshots/ (live-*.png).
"""

from __future__ import annotations

import pytest

from agent import protocol
from fleet import services
from fleet.models import Command, Node
from raymgr import services as ray_services
from tests.e2e.test_browser import _shot, browser_page  # noqa: F401 (the fixture)
from tests.fleet.conftest import facts_dict, make_csr_pem, make_key
from tests.raymgr.conftest import finish, last_command
from tests.support.browser import needs_chromium

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(transaction=True),
    needs_chromium,
]

BOUND_MS = 30_000  # a change must show within this (pages poll every 3 s; the machine may be loaded)
TRACEBACK = 'Traceback (most recent call last):\n  File "pull.py", line 9, in pull\nOSError: no space left on device'


def _node(cluster, owner, hostname: str, *, online: bool) -> Node:
    _, raw = services.join_token_create(cluster=cluster, actor=owner)
    node, _ = services.node_register(token=raw, csr_pem=make_csr_pem(make_key()), facts=facts_dict(hostname))
    if online:
        services.node_connected(
            node=node,
            facts=protocol.from_dict(protocol.HostFacts, facts_dict(hostname), where="facts"),
            inventory=protocol.Inventory(),
        )
    return Node.objects.get(pk=node.pk)


def _sign_in(page, base: str) -> None:
    page.goto(f"{base}/accounts/login/")
    page.fill("input[name=username]", "ops")
    page.fill("input[name=password]", "pw-ops")
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/")


def _mark(page) -> None:
    page.evaluate("window.__notReloaded = true")


def _not_reloaded(page) -> bool:
    return page.evaluate("window.__notReloaded === true")


def _wait_text(page, selector: str, text: str) -> None:
    page.wait_for_function(
        "([s, t]) => { const e = document.querySelector(s); return e && e.innerText.includes(t); }",
        arg=[selector, text],
        timeout=BOUND_MS,
    )


def test_commands_rows_update_live_and_filter(browser_page, control_plane, operator, cluster):  # noqa: F811
    page, errors = browser_page
    owner, _ = operator
    base = control_plane.url
    node = _node(cluster, owner, "box-live", online=False)  # no tunnel: its command waits until we answer
    (command,) = services.command_dispatch(
        actor=owner, cluster=cluster, command_type="model.download", payload={"model_id": "acme/tiny"}, node=node
    )
    (system,) = services.command_queue(  # the control plane's own, outside any operator action
        actor=owner, cluster=cluster, command_type="container.stop", payload={"container": "web"}, node=node
    )
    (broken,) = services.command_dispatch(
        actor=owner, cluster=cluster, command_type="container.stop", payload={"container": "db"}, node=node
    )
    services.command_record_error(node=node, command_id=broken.pk, code="internal", message=TRACEBACK)

    _sign_in(page, base)
    page.goto(f"{base}/compute/clusters/{cluster.pk}/commands/")
    row = f"#command-{command.pk}"
    assert page.locator(row).get_attribute("data-status") in ("queued", "dispatched")
    assert page.locator(f"#command-{system.pk}").count() == 0  # system commands hidden by default
    _shot(page, "live-01-commands-queued")

    # the agent acknowledges, then reports success: the row follows without a reload
    _mark(page)
    services.command_record_ack(node=node, command_id=command.pk)
    _wait_text(page, row, "Running")
    services.command_record_result(node=node, command_id=command.pk, data={"path": "/models/acme/tiny"})
    _wait_text(page, row, "Succeeded")
    assert _not_reloaded(page)
    page.wait_for_selector("#commands[data-live=settled]", timeout=BOUND_MS)  # every row settled: no more polls
    _shot(page, "live-02-commands-succeeded")

    # the error cell: the traceback's last line, the whole text on demand
    cell = page.locator(f"#command-{broken.pk} details")
    assert cell.locator("summary").inner_text() == "internal: OSError: no space left on device"
    assert not cell.locator("pre").is_visible()
    cell.locator("summary").click()
    assert "Traceback (most recent call last):" in cell.locator("pre").inner_text()
    _shot(page, "live-03-commands-error-expanded")

    # filters: show system commands, then only the system's, then by status
    page.check("input[name=show_system]")
    page.click("#command-filters button[type=submit]")
    page.wait_for_selector(f"#command-{system.pk}")
    assert page.locator(f"#command-{system.pk} td").nth(4).inner_text() == "system"
    page.select_option("select[name=by]", "system")
    page.click("#command-filters button[type=submit]")
    page.wait_for_load_state("load")
    assert page.locator("#commands tbody tr").count() == 1
    _shot(page, "live-04-commands-system-only")
    page.goto(f"{base}/compute/clusters/{cluster.pk}/commands/")
    page.select_option("select[name=status]", "failed")
    page.click("#command-filters button[type=submit]")
    page.wait_for_load_state("load")
    assert page.locator("#commands tbody tr").count() == 1
    assert page.locator(f"#command-{broken.pk}").count() == 1
    _shot(page, "live-05-commands-filtered-failed")

    # the send form never offers ray.* and remembers the target after a send
    offered = page.eval_on_selector_all("#command-form select[name=command_type] option", "os => os.map(o => o.value)")
    assert offered
    assert not [o for o in offered if o.startswith("ray.")]
    page.select_option("#command-form select[name=command_type]", "container.stop")
    page.wait_for_selector("#payload-fields input[name=p-container]")
    page.fill("#payload-fields input[name=p-container]", "web")
    page.select_option("#command-form select[name=target]", str(node.pk))
    page.click("#command-form button[type=submit]")
    page.wait_for_load_state("load")
    assert page.locator("#command-form select[name=target]").input_value() == str(node.pk)
    assert Command.objects.filter(payload__container="web", system=False).count() == 1
    assert not errors, errors


def test_ray_cluster_and_training_pages_follow_the_status(browser_page, control_plane, operator, cluster):  # noqa: F811
    page, errors = browser_page
    owner, workspace = operator
    base = control_plane.url
    _node(cluster, owner, "ray-box", online=True)
    ray = ray_services.ray_cluster_create(
        actor=owner,
        workspace=workspace,
        compute_cluster=cluster,
        name="live",
        runtime="process",
        max_workers=0,
        gcs_port=6380,
    )
    _sign_in(page, base)
    page.goto(f"{base}/ray/clusters/{ray.pk}/")
    head = "#ray-cluster-head"
    assert page.locator(f"{head} [data-status]").get_attribute("data-status") == "pending"
    assert page.locator("text=Open Ray Dashboard").count() == 0
    _shot(page, "live-06-ray-pending")

    _mark(page)
    finish(  # the head started: as the tunnel consumer records the agent's result
        last_command("ray.head.start", cluster_id=str(ray.pk)),
        data={"container_id": "c-head", "ray_node_id": "aa" * 28, "ip": "10.0.0.1"},
    )
    page.wait_for_selector(f"{head} [data-status=running]", timeout=BOUND_MS)
    page.wait_for_selector(f"{head} >> text=Open Ray Dashboard", timeout=BOUND_MS)
    _wait_text(page, "#ray-summary", "Running")  # the Summary tab too
    assert _not_reloaded(page)
    _shot(page, "live-07-ray-running")

    from raymgr.workloads import services as workloads

    ray.refresh_from_db()
    job = workloads.training_job_create(
        actor=owner, workspace=workspace, ray_cluster=ray, name="live-job", script="print('hi')\n"
    )
    page.goto(f"{base}/ray/training/{job.pk}/")
    _wait_text(page, "#workload-live h1", "Queued")
    _shot(page, "live-08-training-queued")
    _mark(page)
    finish(last_command("ray.job.submit"), data={"submission_id": job.submission_id, "status": "PENDING"})
    workloads.workloads_poll()
    finish(
        last_command("ray.job.status", submission_id=job.submission_id),
        data={"status": "RUNNING", "logs": "epoch 1", "markers": []},
    )
    _wait_text(page, "#workload-live h1", "Running")
    _wait_text(page, "#workload-live", "epoch 1")
    workloads.workloads_poll()
    finish(
        last_command("ray.job.status", submission_id=job.submission_id),
        data={"status": "SUCCEEDED", "logs": "epoch 1\ndone", "markers": []},
    )
    _wait_text(page, "#workload-live h1", "Succeeded")
    page.wait_for_selector("#workload-live[data-live=settled]", timeout=BOUND_MS)
    assert _not_reloaded(page)
    _shot(page, "live-09-training-succeeded")
    assert not errors, errors

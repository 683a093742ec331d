"""Issue 35 in a real browser (items 2, 5, 6, 7): the Ray cluster's Jobs tab lists its workloads and follows
them live, the workload forms preselect a running cluster and show a training script example, Tune logs read
clean, and a kubernetes node without credentials warns with the fix.

Playwright drives Debian's Chromium against one live daphne (no worker, no agent: the rows are set in the
database as the services and the tunnel consumer leave them). Screenshots at 1366 and 390 px go to
test-output/screenshots/ (ray-fixes-*.png).
"""

from __future__ import annotations

import pytest

from agent import protocol
from fleet import services
from fleet.models import Node
from raymgr.models import RayCluster
from raymgr.workloads.models import ServeDeployment, TrainingJob, TuneExperiment
from tests.e2e.test_browser import _shot, browser_page  # noqa: F401 (the fixture)
from tests.fleet.conftest import facts_dict, make_csr_pem, make_key
from tests.support.browser import needs_chromium
from tests.support.live import ControlPlane, subprocess_env

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(transaction=True),
    needs_chromium,
]

BOUND_MS = 30_000
WIDTHS = ((1366, 900), (390, 844))
TUNE_LOG = (
    "\x1b[2m\x1b[36m(pid=412)\x1b[0m Trial t_00000 started\n"
    '\x1b[36m(Trainable pid=2)\x1b[0m CTFLEET {"kind": "trial", "trial_id": "t_00000", "iteration": 1}\n'
    'CTFLEET {"kind": "best", "config": {"x": 1}}\n'
    "\x1b[1m== Status ==\x1b[0m\nCurrent best trial: t_00000 with score=4.0\n"
)
NO_CREDENTIALS = protocol.InventoryProblem(
    part="containers",
    code="kubernetes_unavailable",
    message="cannot load Kubernetes credentials (in-cluster configuration): Service host/port is not set.",
)


@pytest.fixture
def plane(tmp_path):
    control = ControlPlane(log_dir=tmp_path, env=subprocess_env())
    control.start_replica()
    yield control
    control.stop()


def _node(cluster, owner, hostname: str, inventory: protocol.Inventory) -> Node:
    _, raw = services.join_token_create(cluster=cluster, actor=owner)
    node, _ = services.node_register(token=raw, csr_pem=make_csr_pem(make_key()), facts=facts_dict(hostname))
    services.node_connected(
        node=node,
        facts=protocol.from_dict(protocol.HostFacts, facts_dict(hostname), where="facts"),
        inventory=inventory,
    )
    return Node.objects.get(pk=node.pk)


def _shots(page, name: str) -> None:
    """Screenshots of the open page at each width; the page itself never scrolls sideways."""
    for width, height in WIDTHS:
        page.set_viewport_size({"width": width, "height": height})
        page.wait_for_timeout(150)
        _shot(page, f"ray-fixes-{name}-{width}")
        overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert overflow <= 1, f"{name} at {width} px scrolls sideways by {overflow} px"
    page.set_viewport_size({"width": WIDTHS[0][0], "height": WIDTHS[0][1]})


def test_ray_jobs_forms_logs_and_kubernetes_warning(browser_page, plane, operator):  # noqa: F811
    page, errors = browser_page
    owner, workspace = operator
    base = plane.url
    lab = services.cluster_create(actor=owner, workspace=workspace, name="lab", mode="standalone")
    kube = services.cluster_create(actor=owner, workspace=workspace, name="k8s", mode="kubernetes")
    _node(lab, owner, "box-1", protocol.Inventory())
    kube_node = _node(kube, owner, "kube-1", protocol.Inventory(problems=[NO_CREDENTIALS]))
    RayCluster.objects.create(  # listed first by name, but failed
        workspace=workspace, compute_cluster=lab, name="demo", created_by=owner, status="failed", gcs_port=6390
    )
    ray = RayCluster.objects.create(
        workspace=workspace, compute_cluster=lab, name="train", created_by=owner, status="running", gcs_port=6391
    )
    job = TrainingJob.objects.create(
        workspace=workspace,
        ray_cluster=ray,
        name="fine-tune",
        script="print(1)\n",
        status="running",
        submission_id="train-fine-tune-1",
    )
    ServeDeployment.objects.create(
        workspace=workspace,
        ray_cluster=ray,
        name="llm",
        route_prefix="/llm",
        status="running",
        submission_id="serve-llm",
    )
    tune = TuneExperiment.objects.create(
        workspace=workspace,
        ray_cluster=ray,
        name="sweep",
        status="running",
        submission_id="tune-sweep",
        search_space={"x": {"type": "constant", "value": 1}},
        logs=TUNE_LOG,
    )

    page.goto(f"{base}/accounts/login/")
    page.fill("input[name=username]", "ops")
    page.fill("input[name=password]", "pw-ops")
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/")

    # 2. the Jobs tab lists the cluster's training job, Serve deployment and Tune experiment, and follows them
    page.goto(f"{base}/ray/clusters/{ray.pk}/")
    page.click("nav.tabs >> text=Jobs")
    page.wait_for_selector("#ray-jobs table")
    table = page.inner_text("#ray-jobs")
    assert "No jobs reported by the head" not in table
    for text in (
        "fine-tune",
        "Training job",
        "llm",
        "Serve deployment",
        "sweep",
        "Tune experiment",
        "train-fine-tune-1",
    ):
        assert text in table, text
    assert page.locator('#ray-jobs tr[data-kind="Training job"]').get_attribute("data-status") == "running"
    _shots(page, "jobs-tab")
    page.evaluate("window.__notReloaded = true")
    TrainingJob.objects.filter(pk=job.pk).update(status="succeeded")
    page.wait_for_selector('#ray-jobs tr[data-kind="Training job"][data-status="succeeded"]', timeout=BOUND_MS)
    assert page.evaluate("window.__notReloaded === true")
    _shots(page, "jobs-tab-updated")

    # 6. the forms preselect the running cluster and list the failed one last; the script box shows an example
    for path in ("/ray/training/new/", "/ray/tune/new/", "/ray/serving/new/"):
        page.goto(f"{base}{path}")
        chosen = page.eval_on_selector("select[name=ray_cluster]", "s => s.options[s.selectedIndex].text")
        assert chosen == "train (E2E, running)", (path, chosen)
        labels = page.eval_on_selector_all("select[name=ray_cluster] option", "os => os.map(o => o.text)")
        assert labels[-1] == "demo (E2E, failed: start it again first)", labels
    page.goto(f"{base}/ray/training/new/")
    placeholder = page.get_attribute("textarea[name=script]", "placeholder")
    assert placeholder.startswith("import ctfleet")
    assert "ctfleet.report_checkpoint(path" in placeholder
    assert "Python run on the Ray cluster as train.py" in page.inner_text("main form")
    _shots(page, "training-form")

    # 7. Tune logs: no escape codes, no CTFLEET marker lines
    page.goto(f"{base}/ray/tune/{tune.pk}/")
    logs = page.inner_text("pre.logs")
    assert "(pid=412) Trial t_00000 started" in logs
    assert "Current best trial: t_00000 with score=4.0" in logs
    assert "CTFLEET" not in logs
    assert "\x1b" not in logs
    assert "[36m" not in logs
    _shots(page, "tune-logs")

    # 5. the kubernetes node without credentials: the list and the node page warn with the fix
    page.goto(f"{base}/compute/clusters/{kube.pk}/nodes/")
    warning = page.inner_text(f"#node-{kube_node.pk} .node-problem")
    assert "No Kubernetes API: how to fix" in warning
    _shots(page, "kube-nodes")
    page.click(f"#node-{kube_node.pk} .node-problem a")
    page.wait_for_selector("#node-problems")
    banner = page.inner_text("#node-problems")
    assert "Service host/port is not set." in banner
    assert "CLEVERTHIS_KUBECONFIG" in banner
    assert "systemctl restart cleverthis-agent" in banner
    _shots(page, "kube-node")
    assert not errors, errors

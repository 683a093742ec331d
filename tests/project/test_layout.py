"""The layout keeps its promises: no import circles inside an app, and the fleet's core reaches the
transport and the workloads only through their seams.

Imports are read from the source (module level and inside functions alike), so a lazy import inside a
function counts: it is how circles hide.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
APPS = ("fleet", "raymgr", "agent", "cleverthis", "kernel")
# The fleet core (modules at the top of fleet/ and the fleet.services package) may use these modules of its
# sub-packages, and no others.
CORE_SEAMS = {
    "fleet.tunnel.groups",  # reach a node's tunnel: the one seam to the transport
    "fleet.proxy.wiring",  # plugs the proxy into the tunnel's stream seam at app start (FleetConfig.ready)
    "fleet.workloads.admin",  # registered at app start (FleetConfig.ready): autodiscovery imports only fleet.admin
    "fleet.workloads.models",  # loaded (not re-exported) by fleet.models so Django registers them with the app
    "fleet.workloads.receivers",  # connected at app start (FleetConfig.ready)
    "fleet.proxy.site_checks",  # its system check registered, its start-up warning logged (FleetConfig.ready)
}


def _modules() -> dict[str, Path]:
    found = {}
    for app in APPS:
        for path in (ROOT / app).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            found[name] = path
    return found


MODULES = _modules()


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str) -> set[str]:
    """Project modules `module` imports anywhere in its source."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.Import):
            out.update(filter(None, (_resolve(alias.name) for alias in node.names)))
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                target = submodule if submodule in MODULES else _resolve(node.module)
                if target:
                    out.add(target)
    out.discard(module)
    return out


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        circles.append(sorted(component))
    return circles


def test_the_circle_finder_finds_a_circle():
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_circles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("app", APPS)
def test_no_import_circles_between_modules_of_one_app(app):
    graph = {
        name: {target for target in imports_of(name) if target.split(".")[0] == app}
        for name in MODULES
        if name.split(".")[0] == app
    }
    assert import_circles(graph) == []


def test_the_fleet_core_reaches_transport_and_workloads_only_through_their_seams():
    core_dirs = (ROOT / "fleet", ROOT / "fleet" / "services")
    core = [name for name, path in MODULES.items() if name.startswith("fleet.") and path.parent in core_dirs]
    assert "fleet.services" in core
    packages = ("fleet.tunnel.", "fleet.proxy.", "fleet.workloads.")
    offenders = {
        name: sorted(t for t in imports_of(name) if t.startswith(packages) and t not in CORE_SEAMS) for name in core
    }
    assert {name: found for name, found in offenders.items() if found} == {}


def reachable_from(module: str) -> set[str]:
    """Project modules `module` imports, directly or through the modules it imports."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        for target in imports_of(todo.pop()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_no_module_of_the_tunnel_imports_the_proxy():
    """The transport offers a seam the proxy plugs into (`fleet.tunnel.streams_seam`), never the reverse."""
    tunnel = [name for name in MODULES if name == "fleet.tunnel" or name.startswith("fleet.tunnel.")]
    assert "fleet.tunnel.consumer" in tunnel
    offenders = {name: sorted(t for t in imports_of(name) if t.split(".")[:2] == ["fleet", "proxy"]) for name in tunnel}
    assert {name: found for name, found in offenders.items() if found} == {}


@pytest.mark.parametrize(
    "models", ["fleet.models", "fleet.workloads.models", "raymgr.models", "raymgr.workloads.models"]
)
def test_loading_the_models_loads_nothing_of_the_proxy(models):
    """Models name their origins through `fleet.origin_names`; tickets and cookies stay in `fleet.proxy`."""
    assert sorted(t for t in reachable_from(models) if t.split(".")[:2] == ["fleet", "proxy"]) == []


def test_models_modules_re_export_no_workload_models():
    """`fleet.models` and `raymgr.models` load their workload models for Django without `import *`."""
    for name in ("fleet.models", "raymgr.models"):
        tree = ast.parse(MODULES[name].read_text())
        stars = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.names[0].name == "*"]
        assert stars == [], name


def test_services_enqueue_tasks_only_through_the_seam():
    services = [name for name in MODULES if "services" in name.split(".")]  # modules and packages alike
    assert {"fleet.services.commands", "fleet.workloads.services.endpoints", "raymgr.services"} <= set(services)
    for name in [*services, "fleet.workloads.drain"]:
        assert not {t for t in imports_of(name) if t.endswith(".tasks")}, name


# The control plane's layers: the root imports the apps, the apps import the kernel, never the other way.
APP_PACKAGES = ("cleverthis.tenancy", "cleverthis.audit", "fleet", "raymgr")
KERNEL_MAY_IMPORT = ("agent.protocol",)  # the agent's wire protocol is the ground floor


def _in(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == package or name.startswith(f"{package}.") for package in packages)


def _is_root(name: str) -> bool:
    return _in(name, ("cleverthis",)) and not _in(name, APP_PACKAGES)


def test_the_layer_rules_see_every_layer():
    assert "kernel.api" in MODULES
    assert _is_root("cleverthis.urls")
    assert _is_root("cleverthis")
    assert not _is_root("cleverthis.tenancy.views")
    assert not _is_root("kernel.api")


def test_the_kernel_imports_no_app_and_nothing_of_the_root():
    kernel = [name for name in MODULES if _in(name, ("kernel",))]
    offenders = {
        name: sorted(t for t in imports_of(name) if not _in(t, ("kernel", *KERNEL_MAY_IMPORT))) for name in kernel
    }
    assert {name: found for name, found in offenders.items() if found} == {}


def test_no_app_imports_the_root():
    apps = [name for name in MODULES if _in(name, APP_PACKAGES)]
    offenders = {name: sorted(t for t in imports_of(name) if _is_root(t)) for name in apps}
    assert {name: found for name, found in offenders.items() if found} == {}

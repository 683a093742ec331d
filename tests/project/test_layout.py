"""The layout keeps its promises (docs/architecture.md): no import circles between modules, between sibling
rooms of an app or between apps; arrows point down the floors (root -> apps -> kernel, the agent on its own);
an app's core reaches its rooms only through their seams; services reach Celery only through the enqueue seam.

Imports are read from the source (module level and inside functions alike), so a lazy import inside a
function counts: it is how circles hide. Each rule names its offenders when it fails.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("fleet", "raymgr", "agent", "cleverthis", "kernel", "tenancy", "audit")
APP_PACKAGES = ("tenancy", "audit", "fleet", "raymgr")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
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


def _import_nodes(module: str) -> list[ast.Import | ast.ImportFrom]:
    tree = ast.parse(MODULES[module].read_text())
    return [node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)]


def imports_of(module: str) -> set[str]:
    """Project modules `module` imports anywhere in its source."""
    out: set[str] = set()
    for node in _import_nodes(module):
        if isinstance(node, ast.Import):
            out.update(filter(None, (_resolve(alias.name) for alias in node.names)))
        elif node.module and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                target = submodule if submodule in MODULES else _resolve(node.module)
                if target:
                    out.add(target)
    out.discard(module)
    return out


def top_level_imports_of(module: str) -> set[str]:
    """First names of every absolute import in `module`'s source, third-party and standard library included."""
    out: set[str] = set()
    for node in _import_nodes(module):
        if isinstance(node, ast.Import):
            out.update(alias.name.split(".")[0] for alias in node.names)
        elif node.module and node.level == 0:
            out.add(node.module.split(".")[0])
    return out


GRAPH = {name: imports_of(name) for name in MODULES}


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan, iterative)."""
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


def _in(name: str, packages: Iterable[str]) -> bool:
    return any(name == package or name.startswith(f"{package}.") for package in packages)


def _is_root(name: str) -> bool:
    return _in(name, ("cleverthis",)) and not _in(name, APP_PACKAGES)


def _floor_room(name: str) -> str:
    """The app (or `kernel`, `root`, `agent`) a module belongs to."""
    for app in APP_PACKAGES:
        if _in(name, (app,)):
            return app
    return "root" if _is_root(name) else name.split(".")[0]


def _offenders(modules: Iterable[str], bad) -> dict[str, list[str]]:
    """{module: sorted imports for which `bad(target)` holds}, modules without any left out."""
    found = {name: sorted(t for t in GRAPH[name] if bad(t)) for name in modules}
    return {name: targets for name, targets in found.items() if targets}


def test_the_circle_finder_finds_a_circle():
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_circles({"a": {"b"}, "b": set()}) == []


def test_the_layer_rules_see_every_layer():
    assert {"kernel.api", "agent.protocol", "fleet.groups", "raymgr.workloads.models"} <= set(MODULES)
    assert _is_root("cleverthis.urls")
    assert _is_root("cleverthis")
    assert not _is_root("tenancy.views")
    assert not _is_root("kernel.api")
    assert _floor_room("audit.models") == "audit"
    assert _floor_room("fleet.workloads.services.endpoints") == "fleet"


# ---- circles, at three sizes: modules, sibling rooms of an app, apps ----


def test_no_import_circles_between_modules_of_the_whole_project():
    circles = import_circles(GRAPH)
    assert circles == [], f"modules importing each other (directly or round a circle): {circles}"


# The rooms of an app: sub-packages with a job of their own. The app's core (its top-level modules and
# its services/, api/ and the like) wires them together; rooms never import each other in a circle.
ROOMS = {
    "fleet": ("fleet.tunnel", "fleet.proxy", "fleet.workloads", "fleet.usage"),
    "raymgr": ("raymgr.workloads",),
    "agent": (
        "agent.protocol",
        "agent.transport",
        "agent.executors",
        "agent.ray",
        "agent.workloads",
        "agent.update",
        "agent.install",
    ),
}


def _room_of(name: str, rooms: Iterable[str]) -> str | None:
    return next((room for room in rooms if _in(name, (room,))), None)


def room_graph(rooms: tuple[str, ...]) -> dict[str, set[str]]:
    """Which room imports which sibling room (direct imports between the rooms' own modules)."""
    graph: dict[str, set[str]] = {room: set() for room in rooms}
    for name, targets in GRAPH.items():
        source = _room_of(name, rooms)
        if source:
            graph[source] |= {_room_of(t, rooms) for t in targets} - {None, source}
    return graph


@pytest.mark.parametrize("app", sorted(ROOMS))
def test_no_import_circles_between_sibling_rooms(app):
    assert all(any(_in(name, (room,)) for name in MODULES) for room in ROOMS[app])
    circles = import_circles(room_graph(ROOMS[app]))
    assert circles == [], f"sibling rooms of {app} importing each other: {circles}"


def test_no_import_circles_between_apps():
    graph: dict[str, set[str]] = {}
    for name, targets in GRAPH.items():
        graph.setdefault(_floor_room(name), set()).update(_floor_room(t) for t in targets)
    for room, targets in graph.items():
        targets.discard(room)
    circles = import_circles(graph)
    assert circles == [], f"apps importing each other: {circles}"


# ---- floors: root -> apps -> kernel; the agent stands alone ----

KERNEL_MAY_IMPORT = ("agent.protocol",)  # the agent's wire protocol is the ground floor
# What the control plane may take from the agent package: the wire protocol, the packaging helpers that
# build the agent's sdist and install script (`fleet.agent_packages`, `fleet.agent_views`), and the asyncio
# cancellation fix both sides install at start (`fleet.apps`).
CONTROL_PLANE_MAY_IMPORT_FROM_AGENT = ("agent.protocol", "agent.install", "agent.asyncio_fixes")
# First names of imports that belong to the control plane: the agent never needs them.
CONTROL_PLANE_IMPORTS = frozenset(
    {
        "django",
        "rest_framework",
        "drf_spectacular",
        "django_filters",
        "channels",
        "channels_redis",
        "celery",
        "daphne",
        "kernel",
        "fleet",
        "raymgr",
        "cleverthis",
        "tenancy",
        "audit",
    }
)


def test_the_kernel_imports_no_app_and_nothing_of_the_root():
    kernel = [name for name in MODULES if _in(name, ("kernel",))]
    offenders = _offenders(kernel, lambda t: not _in(t, ("kernel", *KERNEL_MAY_IMPORT)))
    assert offenders == {}, f"kernel modules importing above the kernel: {offenders}"


# Each top-level folder stands on one floor, and arrows only point down: the root folder holds no app.
FOLDER_FLOORS = {"cleverthis": 3, "tenancy": 2, "audit": 2, "fleet": 2, "raymgr": 2, "kernel": 1, "agent": 0}


def test_every_top_level_folder_stands_on_one_floor_and_no_arrow_runs_back_up():
    assert set(FOLDER_FLOORS) == set(PACKAGES)
    assert not any(path.is_dir() and (path / "apps.py").exists() for path in (ROOT / "cleverthis").iterdir())
    upward = {
        name: sorted(t for t in targets if FOLDER_FLOORS[t.split(".")[0]] > FOLDER_FLOORS[name.split(".")[0]])
        for name, targets in GRAPH.items()
    }
    offenders = {name: targets for name, targets in upward.items() if targets}
    assert offenders == {}, f"modules importing a folder on a higher floor: {offenders}"


def test_no_app_imports_the_root():
    apps = [name for name in MODULES if _in(name, APP_PACKAGES)]
    offenders = _offenders(apps, _is_root)
    assert offenders == {}, f"app modules importing the root (urls, asgi, celery, overview, ...): {offenders}"


def test_the_agent_imports_nothing_of_the_control_plane():
    agent = [name for name in MODULES if _in(name, ("agent",))]
    assert "agent.runner" in agent
    found = {name: sorted(top_level_imports_of(name) & CONTROL_PLANE_IMPORTS) for name in agent}
    offenders = {name: tops for name, tops in found.items() if tops}
    assert offenders == {}, f"agent modules importing the control plane or Django: {offenders}"


def test_the_control_plane_imports_only_the_protocol_and_packaging_helpers_of_the_agent():
    control_plane = [name for name in MODULES if not _in(name, ("agent",))]
    offenders = _offenders(
        control_plane, lambda t: _in(t, ("agent",)) and not _in(t, CONTROL_PLANE_MAY_IMPORT_FROM_AGENT)
    )
    assert offenders == {}, f"control-plane modules importing agent internals: {offenders}"


# ---- an app's core reaches its rooms only through their seams ----

# The fleet core (modules at the top of fleet/ and the fleet.services package) may reach these modules of
# its rooms, and no others.
FLEET_SEAMS = {
    "fleet.groups",  # reach a node's tunnel: the one seam to the transport
    "fleet.proxy.site_checks",  # its system check registered, its start-up warning logged (FleetConfig.ready)
    "fleet.workloads.admin",  # registered at app start (FleetConfig.ready): autodiscovery imports only fleet.admin
    "fleet.workloads.models",  # loaded (not re-exported) by fleet.models so Django registers them with the app
    "fleet.workloads.receivers",  # connected at app start (FleetConfig.ready)
    "fleet.usage.models",  # loaded (not re-exported) by fleet.models so Django registers them with the app
    "fleet.usage.admin",  # registered at app start (FleetConfig.ready), as the workload admins are
}
# The raymgr core (modules at the top of raymgr/ and raymgr.services) may reach these of raymgr.workloads.
RAYMGR_SEAMS = {
    "raymgr.workloads.models",  # loaded by raymgr.models so Django registers them with the app
    "raymgr.workloads.wiring",  # connected at app start (RaymgrConfig.ready)
    "raymgr.workloads.views",  # pages mounted by raymgr.urls, cards shown on the Ray dashboard
    "raymgr.workloads.api",  # viewsets mounted by raymgr.api.urls
    "raymgr.workloads.selectors",  # reads: the cluster page's Jobs tab lists the cluster's workloads
}
CORES = {
    "fleet": (("fleet", "fleet/services"), ROOMS["fleet"], FLEET_SEAMS),
    "raymgr": (("raymgr", "raymgr/services"), ROOMS["raymgr"], RAYMGR_SEAMS),
}


def reach_into_rooms(start: Iterable[str], rooms: tuple[str, ...], seams: set[str]) -> dict[str, str]:
    """Room modules outside `seams` that `start` reaches, each with one import path that gets there.

    The walk follows imports through every module outside the rooms; it stops at room modules (a seam's
    own imports are the room's business).
    """
    offenders: dict[str, str] = {}
    seen = set(start)
    todo = [(name, (name,)) for name in start]
    while todo:
        name, path = todo.pop()
        for target in sorted(GRAPH[name]):
            if _room_of(target, rooms):
                if target not in seams:
                    offenders.setdefault(target, " -> ".join((*path, target)))
            elif target not in seen:
                seen.add(target)
                todo.append((target, (*path, target)))
    return offenders


def reachable_from(module: str) -> set[str]:
    """Project modules `module` imports, directly or through the modules it imports."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        for target in GRAPH[todo.pop()]:
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


@pytest.mark.parametrize("app", sorted(CORES))
def test_the_core_reaches_its_rooms_only_through_their_seams(app):
    core_dirs, rooms, seams = CORES[app]
    core = [name for name, path in MODULES.items() if path.parent in {ROOT / d for d in core_dirs}]
    assert f"{app}.services" in core
    assert seams <= set(MODULES)
    offenders = reach_into_rooms(core, rooms, seams)
    assert offenders == {}, f"the {app} core reaches room modules that are no seam: {offenders}"


def test_no_module_of_the_tunnel_imports_the_proxy():
    """The transport offers a seam the proxy plugs into (`fleet.tunnel.streams_seam`), never the reverse."""
    tunnel = [name for name in MODULES if _in(name, ("fleet.tunnel",))]
    assert "fleet.tunnel.consumer" in tunnel
    offenders = _offenders(tunnel, lambda t: _in(t, ("fleet.proxy",)))
    assert offenders == {}, f"tunnel modules importing the proxy: {offenders}"


@pytest.mark.parametrize(
    "models", ["fleet.models", "fleet.workloads.models", "raymgr.models", "raymgr.workloads.models"]
)
def test_loading_the_models_loads_nothing_of_the_proxy(models):
    """Models name their origins through `fleet.origin_names`; tickets and cookies stay in `fleet.proxy`."""
    found = sorted(t for t in reachable_from(models) if _in(t, ("fleet.proxy",)))
    assert found == [], f"loading {models} loads proxy modules: {found}"


# ---- services ----


def test_services_enqueue_tasks_only_through_the_seam():
    """Tasks import services, never the reverse: services send tasks by name through `fleet.enqueue`."""
    services = [name for name in MODULES if "services" in name.split(".")]  # modules and packages alike
    assert {
        "fleet.services.commands",
        "fleet.workloads.services.endpoints",
        "raymgr.services.lifecycle",
        "raymgr.workloads.services.jobs",
        "tenancy.services",
    } <= set(services)
    checked = [*services, "fleet.workloads.drain"]
    offenders = _offenders(checked, lambda t: t.rpartition(".")[2] == "tasks")
    offenders.update({name: ["celery"] for name in checked if "celery" in top_level_imports_of(name)})
    assert offenders == {}, f"services importing tasks or Celery (use fleet.enqueue): {offenders}"


# ---- models ----


def _python_files() -> list[Path]:
    """Every Python file of the project but migrations: the packages, the tests, the benches."""
    paths = [path for folder in (*PACKAGES, "tests", "bench") for path in (ROOT / folder).rglob("*.py")]
    return [path for path in [*paths, *ROOT.glob("*.py")] if "migrations" not in path.parts]


def test_nothing_imports_models_with_a_star():
    """Models modules are imported by name (`from fleet.workloads import models`), never `import *`-ed."""
    offenders = []
    for path in _python_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.ImportFrom)
                and any(alias.name == "*" for alias in node.names)
                and "models" in (node.module or "").split(".")
            ):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == [], f"`from ... models import *` found: {offenders}"


def _package_of(name: str) -> str:
    """The package a module sits in (a package's `__init__` stands for the package itself)."""
    return name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0] or name


def test_no_import_circles_between_packages():
    """Sub-package by sub-package (`fleet.services`, `fleet.tunnel`, ...), none imports another round a circle.

    A package's own modules (an app's core, a room's core) wire its sub-packages together: arrows between a
    package and the packages inside it are left out."""
    graph: dict[str, set[str]] = {}
    for name, targets in GRAPH.items():
        source = _package_of(name)
        graph.setdefault(source, set()).update(
            p for t in targets if not (_in(p := _package_of(t), (source,)) or _in(source, (p,)))
        )
    circles = import_circles(graph)
    assert circles == [], f"packages importing each other (directly or round a circle): {circles}"

"""A web process keeps what its start-up loaded out of the garbage collector's full passes: such a pass over the
whole application (~200,000 objects) stopped the event loop, and every stream the process relayed, for 30-350 ms
on two busy cores (README: the proxy's extra at 8 streams)."""

from __future__ import annotations

import subprocess
import sys

from tests.support.processes import REPO_ROOT, clean_environ

# After loading the ASGI application: how many objects are frozen, and how many a full pass still walks.
PROBE = "import gc, cleverthis.asgi; print(gc.get_freeze_count(), len(gc.get_objects()))"


def _load_app(**env: str) -> tuple[int, int]:
    environ = {**clean_environ(), "DJANGO_SETTINGS_MODULE": "cleverthis.settings.test", **env}
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO_ROOT, env=environ, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-2000:]
    frozen, tracked = done.stdout.split()[-2:]
    return int(frozen), int(tracked)


def test_the_loaded_application_is_frozen_out_of_full_collections():
    frozen, tracked = _load_app()
    assert frozen > 50_000  # the application's modules, classes, URLconf and templates
    assert tracked < frozen / 10  # a full pass walks a small part of what it walked before


def test_web_gc_freeze_0_leaves_the_collector_as_python_sets_it():
    frozen, tracked = _load_app(WEB_GC_FREEZE="0")
    assert frozen == 0
    assert tracked > 50_000

"""Work a web process does once at start-up rather than in the first request that needs it."""

from __future__ import annotations

import gc

from django.conf import settings
from django.template import TemplateDoesNotExist, TemplateSyntaxError
from django.template.loader import get_template


def compile_templates() -> int:
    """Compile every template under the project's templates/ folder into the cached loader (a no-op for
    the loader's cache where DEBUG turns it off); returns how many were compiled. A template that does not
    compile is left for its page to report, as before."""
    root = settings.BASE_DIR / "templates"
    compiled = 0
    for path in sorted(root.rglob("*.html")):
        try:
            get_template(path.relative_to(root).as_posix())
        except (TemplateDoesNotExist, TemplateSyntaxError):
            continue
        compiled += 1
    return compiled


def freeze_start_up_objects() -> int:
    """Collect once, then move every object still alive (modules, classes, the URLconf, compiled templates:
    ~200,000 here) to the collector's permanent generation, so a full collection (generation 2) walks only
    what was made since instead of the whole loaded application. Such a collection stopped a web process's
    event loop, and every stream it relayed, for 30-350 ms at a time on two busy cores (`bench/proxy_extra.py
    --trace`). Returns how many objects are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()

"""Work a web process does once at start-up rather than in the first request that needs it."""

from __future__ import annotations

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

"""WSGI entry point (management tooling only; the product is served over ASGI: uvicorn, daphne in development)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cleverthis.settings.base")
application = get_wsgi_application()

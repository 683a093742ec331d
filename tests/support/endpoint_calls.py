"""Calls the end-to-end tests of endpoints make through the control plane: an endpoint's status as stored, and
a greedy completion of 8 tokens through its URL."""

from __future__ import annotations

import requests

from fleet.workloads.models import Endpoint


def status_of(endpoint: Endpoint) -> str:
    """The endpoint's status as the database holds it now."""
    return Endpoint.objects.get(pk=endpoint.pk).status


def complete(base: str, headers: dict[str, str], model: str) -> dict:
    """A greedy completion of exactly 8 tokens through `base` (the web server; `headers` name the endpoint's
    host and the credentials); its JSON answer, after asserting a 200."""
    body = {"model": model, "prompt": "the fleet runs", "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    answer = requests.post(f"{base}/v1/completions", json=body, headers=headers, timeout=300)
    assert answer.status_code == 200, answer.text
    return answer.json()

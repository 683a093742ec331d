"""ctfleet: the command line and Python SDK of CleverThis Compute Fleet.

`from ctfleet import Client` gives the SDK (`ctfleet.client.Client`); the generated request and response
models are in `ctfleet.models`, the typed errors in `ctfleet.errors`. Names are loaded on first use, so
`ctfleet --help` starts without the HTTP stack.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["Client", "__version__"]


def __getattr__(name: str) -> Any:
    if name == "Client":
        from ctfleet.client import Client

        return Client
    raise AttributeError(name)

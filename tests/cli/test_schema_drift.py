"""The SDK's models cannot drift from the API: regenerating `client/ctfleet/models.py` from the schema the
server publishes gives the checked-in file, byte for byte (runs in CI with the rest of the suite).

After an API change: `python -m ctfleet.codegen --url http://127.0.0.1:8000 > client/ctfleet/models.py`
(or `manage.py spectacular --format openapi-json --file s.json` and `python -m ctfleet.codegen s.json`).
"""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest
from ctfleet import codegen, models
from drf_spectacular.generators import SchemaGenerator

MODELS_FILE = Path(codegen.__file__).with_name("models.py")


@pytest.fixture(scope="module")
def live_schema():
    return SchemaGenerator().get_schema(request=None, public=True)


def test_the_checked_in_models_are_what_the_live_schema_generates(live_schema):
    generated = codegen.generate(live_schema)
    checked_in = MODELS_FILE.read_text()
    diff = "".join(
        difflib.unified_diff(
            checked_in.splitlines(True), generated.splitlines(True), "checked-in models.py", "from the live schema", n=1
        )
    )
    assert generated == checked_in, (
        f"the SDK drifted from the API; regenerate (see this test's docstring):\n{diff[:6000]}"
    )


def test_a_schema_change_is_a_difference(live_schema):
    """The check is not blind: a field added to a response model changes the generated text."""
    changed = {**live_schema, "components": {"schemas": {**live_schema["components"]["schemas"]}}}
    node = dict(changed["components"]["schemas"]["Node"])
    node["properties"] = {**node["properties"], "rack": {"type": "string", "readOnly": True}}
    changed["components"]["schemas"]["Node"] = node
    assert codegen.generate(changed) != MODELS_FILE.read_text()


def test_every_operation_and_model_the_sdk_uses_is_in_the_schema(live_schema):
    operation_ids = {op["operationId"] for ops in live_schema["paths"].values() for op in ops.values()}
    assert set(models.OPERATIONS) == operation_ids
    assert {"Node", "Command", "Endpoint", "Cluster", "Workspace", "Quotas", "ApiKey"} <= set(models.MODELS)

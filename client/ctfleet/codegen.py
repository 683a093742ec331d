"""Generate `ctfleet/models.py` from the control plane's OpenAPI schema.

Every component schema becomes a typed model class (objects) or a `Literal` alias (string enums), with
`from_dict` / `to_dict`; every operation becomes an entry of `OPERATIONS` (operationId → method, path).
The output depends only on the schema, so regenerating from the server's schema and comparing it with the
checked-in file tells whether the SDK has drifted (tests/cli/test_schema_drift.py does, in CI).

    python -m ctfleet.codegen schema.json > client/ctfleet/models.py
    python -m ctfleet.codegen --url http://127.0.0.1:8000 > client/ctfleet/models.py
"""

from __future__ import annotations

import argparse
import json
import keyword
import sys
from typing import Any

HEADER = '''"""Request and response models of the CleverThis Compute Fleet API, generated from its OpenAPI schema.

Do not edit: regenerate with `python -m ctfleet.codegen schema.json > client/ctfleet/models.py`.
Schema: {title} {version}.
"""

from __future__ import annotations

from typing import Any, Literal

'''

_SCALARS = {"string": "str", "integer": "int", "number": "float", "boolean": "bool"}


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _field_name(name: str) -> str:
    return f"{name}_" if keyword.iskeyword(name) else name


class Generator:
    """Turns one OpenAPI document into the source text of `models.py`."""

    def __init__(self, schema: dict[str, Any]) -> None:
        self.schema = schema
        self.components: dict[str, Any] = schema.get("components", {}).get("schemas", {})

    def _is_dataclass(self, name: str) -> bool:
        comp = self.components.get(name, {})
        return comp.get("type") == "object" or ("properties" in comp and "enum" not in comp)

    def _target(self, prop: dict[str, Any]) -> str | None:
        """The component a property refers to (directly or through a one-element allOf)."""
        if "$ref" in prop:
            return _ref_name(prop["$ref"])
        all_of = prop.get("allOf")
        if isinstance(all_of, list) and len(all_of) == 1 and "$ref" in all_of[0]:
            return _ref_name(all_of[0]["$ref"])
        return None

    def annotation(self, prop: dict[str, Any]) -> str:
        """The Python type of a property schema."""
        target = self._target(prop)
        if target is not None:
            base = target if target in self.components else "Any"
        elif prop.get("type") == "array":
            base = f"list[{self.annotation(prop.get('items', {}))}]"
        elif prop.get("type") == "object" or "additionalProperties" in prop:
            extra = prop.get("additionalProperties")
            value = self.annotation(extra) if isinstance(extra, dict) and extra else "Any"
            base = f"dict[str, {value}]"
        elif prop.get("type") in _SCALARS and "enum" not in prop:
            base = _SCALARS[prop["type"]]
        elif "enum" in prop:
            base = "Literal[" + ", ".join(repr(v) for v in prop["enum"] if v is not None) + "]"
        else:
            base = "Any"
        return f"{base} | None" if prop.get("nullable") and base != "Any" else base

    def _from_expr(self, prop: dict[str, Any], value: str) -> str:
        """Source converting the JSON `value` of a property into its Python value."""
        target = self._target(prop)
        if target is not None and self._is_dataclass(target):
            return f"_opt({target}.from_dict, {value})"
        if prop.get("type") == "array":
            item = prop.get("items", {})
            item_target = self._target(item)
            if item_target is not None and self._is_dataclass(item_target):
                return f"_list({item_target}.from_dict, {value})"
        return value

    def _to_expr(self, prop: dict[str, Any], value: str) -> str:
        target = self._target(prop)
        if target is not None and self._is_dataclass(target):
            return f"_opt(_dump, {value})"
        if prop.get("type") == "array":
            item_target = self._target(prop.get("items", {}))
            if item_target is not None and self._is_dataclass(item_target):
                return f"_list(_dump, {value})"
        return value

    def alias(self, name: str, comp: dict[str, Any]) -> str:
        if "enum" in comp:
            values = ", ".join(repr(v) for v in comp["enum"] if v is not None)
            return f"{name} = Literal[{values}]\n"
        return f"{name} = dict[str, Any]\n"

    def dataclass(self, name: str, comp: dict[str, Any]) -> str:
        """A model class: keyword-only `__init__`, `__slots__`, `from_dict` / `to_dict` (plain code rather than
        @dataclass, whose per-class code generation at import cost ~0.1 s for the whole schema)."""
        props: dict[str, Any] = comp.get("properties", {}) or {"extra": {"type": "object", "nullable": True}}
        required = set(comp.get("required", [])) if "properties" in comp else set()
        doc = (comp.get("description") or name).strip().split("\n\n")[0].replace("\n", " ").replace('"""', "'''")
        fields = [(prop_name, _field_name(prop_name), prop) for prop_name, prop in props.items()]
        lines = [f"class {name}(_Model):", f'    """{doc}"""', ""]
        lines.append("    __slots__ = (" + "".join(f"{f!r}, " for _, f, _ in fields).rstrip() + ")")
        params = []
        for prop_name, field, prop in fields:
            annotation = self.annotation(prop)
            if prop_name in required:
                params.append(f"{field}: {annotation}")
            else:
                optional = (
                    annotation if annotation.endswith("| None") or annotation == "Any" else f"{annotation} | None"
                )
                params.append(f"{field}: {optional} = None")
        lines += ["", "    def __init__(", "        self,", "        *,"]
        lines += [f"        {p}," for p in params]
        lines.append("    ) -> None:")
        lines += [f"        self.{field} = {field}" for _, field, _ in fields]
        lines += ["", "    @classmethod", f"    def from_dict(cls, data: dict[str, Any]) -> {name}:"]
        if "properties" in comp:
            lines.append("        return cls(")
            for prop_name, field, prop in fields:
                getter = f"data[{prop_name!r}]" if prop_name in required else f"data.get({prop_name!r})"
                lines.append(f"            {field}={self._from_expr(prop, getter)},")
            lines.append("        )")
        else:
            lines.append("        return cls(extra=dict(data))")
        lines += ["", "    def to_dict(self) -> dict[str, Any]:"]
        if "properties" in comp:
            lines.append("        out: dict[str, Any] = {}")
            for prop_name, field, prop in fields:
                expr = self._to_expr(prop, f"self.{field}")
                if prop_name in required:
                    lines.append(f"        out[{prop_name!r}] = {expr}")
                else:
                    lines.append(f"        if self.{field} is not None:")
                    lines.append(f"            out[{prop_name!r}] = {expr}")
            lines.append("        return out")
        else:
            lines.append("        return dict(self.extra or {})")
        return "\n".join(lines) + "\n"

    def operations(self) -> str:
        rows = []
        for path, ops in sorted(self.schema.get("paths", {}).items()):
            for method, op in sorted(ops.items()):
                if isinstance(op, dict) and "operationId" in op:
                    rows.append(f"    {op['operationId']!r}: ({method.upper()!r}, {path!r}),")
        return (
            "# Every operation of the API: operationId -> (HTTP method, path template).\n"
            "OPERATIONS: dict[str, tuple[str, str]] = {\n" + "\n".join(rows) + "\n}\n"
        )

    def render(self) -> str:
        info = self.schema.get("info", {})
        out = [HEADER.format(title=info.get("title", "API"), version=info.get("version", ""))]
        out.append(
            "def _opt(fn: Any, value: Any) -> Any:\n"
            "    return None if value is None else fn(value)\n\n\n"
            "def _list(fn: Any, value: Any) -> Any:\n"
            "    return None if value is None else [fn(item) for item in value]\n\n\n"
            "def _dump(value: Any) -> Any:\n"
            "    return value.to_dict()\n\n\n"
            "class _Model:\n"
            '    """Base of the models: equality and repr over the fields (`__slots__`)."""\n\n'
            "    __slots__ = ()\n\n"
            "    def __eq__(self, other: object) -> bool:\n"
            "        return type(other) is type(self) and all(\n"
            "            getattr(self, f) == getattr(other, f) for f in self.__slots__  # type: ignore[attr-defined]\n"
            "        )\n\n"
            "    def __repr__(self) -> str:\n"
            "        shown = (f'{f}={getattr(self, f)!r}' for f in self.__slots__)  # type: ignore[attr-defined]\n"
            "        return f\"{type(self).__name__}({', '.join(shown)})\"\n\n"
            "    __hash__ = None  # type: ignore[assignment]\n"
        )
        names = sorted(self.components)
        for name in names:
            comp = self.components[name]
            if not self._is_dataclass(name):
                out.append("\n" + self.alias(name, comp))
        for name in names:
            if self._is_dataclass(name):
                out.append("\n\n" + self.dataclass(name, self.components[name]))
        dataclasses = [n for n in names if self._is_dataclass(n)]
        out.append(
            "\n\n# Component name -> model class.\nMODELS: dict[str, type] = {\n"
            + "".join(f"    {n!r}: {n},\n" for n in dataclasses)
            + "}\n\n"
        )
        out.append(self.operations())
        return "".join(out)


def generate(schema: dict[str, Any]) -> str:
    """The source text of `models.py` for `schema` (an OpenAPI document as a dict)."""
    return Generator(schema).render()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ctfleet.codegen", description=__doc__.split("\n\n")[0])
    parser.add_argument("schema", nargs="?", help="an OpenAPI JSON file (default: stdin)")
    parser.add_argument("--url", help="fetch the schema from this control plane's /api/schema/ instead")
    args = parser.parse_args(argv)
    if args.url:
        from ctfleet._httpx import httpx

        response = httpx.get(args.url.rstrip("/") + "/api/schema/", params={"format": "json"}, timeout=60)
        response.raise_for_status()
        schema = response.json()
    elif args.schema:
        with open(args.schema, encoding="utf-8") as fh:
            schema = json.load(fh)
    else:
        schema = json.load(sys.stdin)
    sys.stdout.write(generate(schema))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

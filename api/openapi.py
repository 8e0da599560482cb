"""The OpenAPI document with every schema reachable from `#/components/schemas`.

The job submit route declares its body as `JobSpec.model_json_schema()`, which carries
its nested models in a local `$defs` with `#/$defs/...` references. Inside an OpenAPI
document those references point at the document's root, where nothing is: ReDoc refuses
the document and Swagger UI cannot expand the body. Hoisting the `$defs` into
`components/schemas` makes the references resolve for every OpenAPI tool.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI

log = logging.getLogger(__name__)

LOCAL_REF = "#/$defs/"
COMPONENT_REF = "#/components/schemas/"


def hoist_local_defs(document: dict[str, Any]) -> dict[str, Any]:
    """Move every nested `$defs` into components/schemas and repoint its references."""
    schemas: dict[str, Any] = document.setdefault("components", {}).setdefault("schemas", {})

    def visit(node: Any) -> Any:
        if isinstance(node, list):
            return [visit(item) for item in node]
        if not isinstance(node, dict):
            return node
        for name, schema in node.pop("$defs", {}).items():
            hoisted = visit(schema)
            if schemas.setdefault(name, hoisted) != hoisted:
                log.warning("OpenAPI: two different schemas are named %s; keeping the first", name)
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(LOCAL_REF):
            node["$ref"] = COMPONENT_REF + ref.removeprefix(LOCAL_REF)
        return {key: visit(value) for key, value in node.items()}

    paths = visit(document.get("paths", {}))
    document["paths"] = paths
    return document


def install_openapi(app: FastAPI) -> None:
    """Serve the hoisted document at app.openapi_url (built once, like FastAPI's own)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = hoist_local_defs(build())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

"""Generate the JSON Schema of the wire contract from the method table."""

from __future__ import annotations

from pathlib import Path
from typing import Final

import msgspec

from memorizz.api.methods import (
    METHODS,
    LogNotification,
    ProgressNotification,
    ResourceUpdatedNotification,
)
from memorizz.api.protocol import PROTOCOL_VERSION, ErrorObject

SCHEMA_PATH: Final = Path(__file__).parent / "schema" / f"v{PROTOCOL_VERSION}.json"


def generate() -> bytes:
    """The schema document: every method's params, result, the roles that may
    call it and whether it relays MCP, plus the error object and the
    notifications the daemon sends unasked."""
    notes = {
        "notifications/progress": ProgressNotification,
        "notifications/message": LogNotification,
        "notifications/resources/updated": ResourceUpdatedNotification,
    }
    types: list[type] = [ErrorObject, *notes.values()]
    first = len(types)
    for spec in METHODS.values():
        types += [spec.params, spec.result]
    refs, components = msgspec.json.schema_components(
        types, ref_template="#/$defs/{name}"
    )
    methods = {
        name: {
            "description": spec.doc,
            "params": refs[first + 2 * i],
            "result": refs[first + 1 + 2 * i],
            "roles": sorted(spec.roles),
            "mcp_passthrough": spec.passthrough,
        }
        for i, (name, spec) in enumerate(METHODS.items())
    }
    document = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"memorizz socket protocol v{PROTOCOL_VERSION}",
        "protocol_version": PROTOCOL_VERSION,
        "methods": methods,
        "error": refs[0],
        "notifications": {name: refs[1 + i] for i, name in enumerate(notes)},
        "$defs": components,
    }
    return msgspec.json.format(msgspec.json.encode(document), indent=2) + b"\n"


if __name__ == "__main__":
    SCHEMA_PATH.write_bytes(generate())
    print(f"wrote {SCHEMA_PATH}")  # noqa: T201

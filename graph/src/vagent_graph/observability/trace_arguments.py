"""Tool-call arguments as a turn trace keeps them (`ToolCallTrace.arguments`, for
TRACE_TTL_SECONDS: 7 days by default). Pure.

Why not simply the audit trail's rule (`vagent_shared.audit.scrub`): it leaves out only the
arguments whose NAME says they are text (`description`, `query`, ...), so an MCP tool's
`title` or `notes` would be kept word for word. Here every string is free text unless the
tool's schema makes it a choice (one of its `enum`, its `const`) or a date or time its
`format` asks for; free text is kept only with OTEL_CAPTURE_CONTENT, and then as the audit
trail keeps content (secret-looking parts masked, each value cut). Secrets by name and by
shape are removed in every case, names included, and the whole is capped.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import date, datetime, time
from typing import Any

from vagent_shared.audit import REDACTED, scrub
from vagent_shared.secrets import mask_secrets, secret_name

#: About the most characters (as JSON) one call's arguments take in a trace: a value that
#: does not fit is replaced by its size, and the names that do not fit by their number.
MAX_TRACE_ARGUMENTS_CHARS = 2000
MAX_NAME_CHARS = 64
MAX_ARGUMENTS = 20

Schema = Mapping[str, Any]


def _resolve(schema: Any, root: Schema) -> Schema:
    """`schema` with a local `$ref` (`#/$defs/Priority`, as pydantic writes enums) followed."""
    if not isinstance(schema, Mapping):
        return {}
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part) if isinstance(target, Mapping) else None
        return target if isinstance(target, Mapping) else {}
    return schema


def _alternatives(schema: Schema, root: Schema) -> list[Schema]:
    options = [*schema.get("anyOf", []), *schema.get("oneOf", [])]
    return [_resolve(s, root) for s in options] if options else [schema]


def structured(value: Any, schema: Any, root: Schema) -> bool:
    """Is `value` no free text, by itself (a number, a flag, null) or by its schema (one of
    the declared choices, a date)? Lists and objects are, when all they hold is."""
    if value is None or isinstance(value, bool | int | float):
        return True
    schemas = _alternatives(_resolve(schema, root), root)
    if isinstance(value, str):
        return any(_chosen(value, s) for s in schemas)
    if isinstance(value, list):
        return any(all(structured(v, s.get("items"), root) for v in value) for s in schemas)
    if isinstance(value, Mapping):
        return any(_all_declared(value, s.get("properties"), root) for s in schemas)
    return False


def _chosen(value: str, schema: Schema) -> bool:
    enum = schema.get("enum")
    return (
        (isinstance(enum, list) and value in enum)
        or schema.get("const") == value
        or _formatted(value, schema)
    )


def _formatted(value: str, schema: Schema) -> bool:
    """Is `value` a date or time as its schema's `format` says (a schema's word is not
    enough: JSON-schema validation does not check formats, so any text could claim it)?"""
    kind = schema.get("format")
    parse = {"date": date.fromisoformat, "date-time": datetime.fromisoformat, "time": time.fromisoformat}
    if kind not in parse or len(value) > 40:
        return False
    try:
        parse[kind](value.replace("Z", "+00:00") if kind != "date" else value)
    except ValueError:
        return False
    return True


def _all_declared(value: Mapping[str, Any], properties: Any, root: Schema) -> bool:
    if not isinstance(properties, Mapping):
        return False
    return all(k in properties and structured(v, properties[k], root) for k, v in value.items())


def _size(value: Any) -> int:
    return len(value) if isinstance(value, str) else len(json.dumps(value, default=str, ensure_ascii=False))


def trace_arguments(args: Mapping[str, Any], parameters: Schema | None, capture: bool) -> dict[str, Any]:
    """`args` fit for a turn trace: `parameters` is the tool's JSON schema (None: unknown,
    every string is free text); `capture` is OTEL_CAPTURE_CONTENT."""
    root: Schema = parameters or {}
    declared = root.get("properties")
    properties: Schema = declared if isinstance(declared, Mapping) else {}
    out: dict[str, Any] = {}
    used = 2
    for i, (raw_name, value) in enumerate(args.items()):
        if i == MAX_ARGUMENTS:
            out["…"] = f"[{len(args) - MAX_ARGUMENTS} more arguments]"
            break
        name = mask_secrets(str(raw_name), REDACTED)[:MAX_NAME_CHARS]
        if secret_name(str(raw_name)):
            kept: Any = REDACTED
        elif value in (None, "") or capture or structured(value, properties.get(raw_name), root):
            kept = scrub(value, include_content=capture, depth=1, key=str(raw_name))
        else:
            kept = f"[omitted: {_size(value)} chars]"
        piece = len(json.dumps({name: kept}, default=str, ensure_ascii=False))
        if used + piece > MAX_TRACE_ARGUMENTS_CHARS:
            kept = f"[omitted: {_size(value)} chars]"
            piece = len(json.dumps({name: kept}, ensure_ascii=False))
        if used + piece > MAX_TRACE_ARGUMENTS_CHARS:
            out["…"] = f"[{len(args) - i} more arguments]"
            break
        out[name] = kept
        used += piece
    return out

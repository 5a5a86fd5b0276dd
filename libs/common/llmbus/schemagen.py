"""Generates schemas/ from the models: JSON Schema per message, AsyncAPI per service, topic catalog.

`python -m llmbus.schemagen --out schemas` writes them; `--check` fails (exit 1) when
the committed files differ from what the code would write — `make test` runs the check.
`schemas/previous/` (the released contract, llmbus.contract.compat) is not generated here.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from llmbus import messages as m
from llmbus import topics as t
from llmbus.contract.cloudevents import event_type

ASYNCAPI_VERSION = "3.0.0"


def message_models() -> list[type[m.Message]]:
    return sorted({spec.value for spec in (*t.CATALOG, *t.PATTERN_SPECS)}, key=lambda cls: cls.__name__)


def _dump_json(data: object) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def topic_catalog() -> list[dict[str, object]]:
    return [
        {
            "name": spec.name,
            "key": spec.key,
            "value": spec.value.schema_name(),
            "partitions": spec.partitions,
            "retention_ms": spec.retention_ms,
            "compacted": spec.compacted,
            "writers": list(spec.writers),
            "readers": list(spec.readers),
            "notes": spec.notes,
        }
        for spec in (*t.CATALOG, *t.PATTERN_SPECS)
    ]


def cloudevent_header_schema(ce_type: str) -> dict[str, object]:
    """The CloudEvents (Kafka binary mode) headers of a message analytics reads (schemas/README.md)."""
    return {
        "ce_specversion": {"type": "string", "const": "1.0"},
        "ce_id": {"type": "string", "description": "the record's idempotency id: deduplicate on it"},
        "ce_source": {"type": "string", "description": "/llmbus/<service>"},
        "ce_type": {"type": "string", "const": ce_type},
        "ce_time": {"type": "string", "format": "date-time"},
        "ce_subject": {"type": "string", "description": "the tenant (experiment id, pool where there is none)"},
        "content-type": {"type": "string", "const": "application/json"},
    }


def asyncapi_for(service: str) -> dict[str, object]:
    """AsyncAPI 3 document: the channels a service sends to and receives from."""
    channels: dict[str, object] = {}
    operations: dict[str, object] = {}
    components: dict[str, object] = {}
    for spec in (*t.CATALOG, *t.PATTERN_SPECS):
        sends, receives = service in spec.writers, service in spec.readers
        if not (sends or receives):
            continue
        channel_id = spec.name.replace(".", "_").replace("<", "").replace(">", "")
        name = spec.value.__name__
        channels[channel_id] = {
            "address": spec.name,
            "description": f"key: {spec.key}. {spec.notes}".strip(),
            "messages": {name: {"$ref": f"#/components/messages/{name}"}},
            "bindings": {
                "kafka": {
                    "partitions": spec.partitions,
                    "topicConfiguration": {
                        "cleanup.policy": ["compact" if spec.compacted else "delete"],
                        "retention.ms": spec.retention_ms,
                    },
                }
            },
        }
        headers: dict[str, object] = {
            "llmbus-schema": {"type": "string", "const": spec.value.schema_name()},
            "traceparent": {"type": "string", "description": "W3C trace context"},
            "llmbus-request-id": {"type": "string"},
            "llmbus-tenant": {"type": "string"},
        }
        if (ce_type := event_type(spec.value)) is not None:
            headers |= cloudevent_header_schema(ce_type)
        components[name] = {
            "name": name,
            "contentType": "application/json",
            "headers": {"type": "object", "properties": headers},
            "payload": {"$ref": f"../messages/{name}.json"},
        }
        for action, applies in (("send", sends), ("receive", receives)):
            if applies:
                operations[f"{action}_{channel_id}"] = {
                    "action": action,
                    "channel": {"$ref": f"#/channels/{channel_id}"},
                }
    return {
        "asyncapi": ASYNCAPI_VERSION,
        "info": {"title": f"llmbus {service}", "version": "1"},
        "defaultContentType": "application/json",
        "servers": {"local": {"host": "127.0.0.1:9092", "protocol": "kafka"}},
        "channels": channels,
        "operations": operations,
        "components": {"messages": components},
    }


def _open_to_additions(schema: object) -> None:
    """Drop every `additionalProperties: false`: readers of internal topics ignore unknown fields."""
    if isinstance(schema, dict):
        if schema.get("additionalProperties") is False:
            del schema["additionalProperties"]
        for value in schema.values():
            _open_to_additions(value)
    elif isinstance(schema, list):
        for value in schema:
            _open_to_additions(value)


def message_schema(model: type[m.Message]) -> dict[str, object]:
    """A message's JSON Schema: versioned (`$id`, `x-llmbus-schema-version`), closed only for client input."""
    schema = model.model_json_schema()
    if not model.STRICT_INPUT:
        _open_to_additions(schema)
    schema["$id"] = f"https://llmbus.dev/schemas/{model.schema_name()}"
    schema["x-llmbus-schema-version"] = model.SCHEMA_VERSION
    return schema


def render() -> dict[str, str]:
    files: dict[str, str] = {}
    for model in message_models():
        schema = message_schema(model)
        files[f"messages/{model.__name__}.json"] = _dump_json(schema)
    files["topics.json"] = _dump_json(topic_catalog())
    for service in t.ALL_SERVICES:
        files[f"asyncapi/{service}.yaml"] = yaml.safe_dump(asyncapi_for(service), sort_keys=False, width=120)
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("schemas"))
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    files = render()
    if args.check:
        existing = {
            str(p.relative_to(args.out))
            for p in args.out.rglob("*")
            if p.is_file() and p.name != "README.md" and p.relative_to(args.out).parts[0] != "previous"
        }
        drift = sorted(
            name
            for name, text in files.items()
            if not (args.out / name).exists() or (args.out / name).read_text() != text
        )
        drift += sorted(existing - set(files))
        if drift:
            print(
                f"schemas/ drifted from the models ({len(drift)} files): {', '.join(drift)}\n"
                "run `make schemas` and commit the result",
                file=sys.stderr,
            )
            return 1
        print(f"schemas/ up to date ({len(files)} files)")
        return 0
    for name, text in files.items():
        path = args.out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    print(f"wrote {len(files)} files under {args.out}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Generates schemas/ from the code: JSON Schema per message, AsyncAPI per service, topic catalog.

The AsyncAPI documents and the catalog's readers and writers come from the services' declared
subscriptions and publications (llmbus.contract.contracts), which the services subscribe through.

`python -m llmbus.contract.schemagen --out schemas` writes them; `--check` fails (exit 1) when
the committed files differ from what the code would write — `make test` runs the check.
`schemas/previous/` (the released contract, llmbus.contract.compat) is not generated here.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

from llmbus.contract import contracts
from llmbus.contract import messages as m
from llmbus.contract import topics as t
from llmbus.contract.cloudevents import event_type
from llmbus.contract.declarations import Contract, Reads
from llmbus.contract.manifest import MANIFEST_VERSION, ModelManifest

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


def _spec(topic: str) -> t.TopicSpec:
    return t.BY_NAME.get(topic) or next(spec for spec in t.PATTERN_SPECS if spec.name == topic)


def _channel_id(topic: str) -> str:
    return topic.replace(".", "_").replace("<", "").replace(">", "")


def _channel(spec: t.TopicSpec) -> dict[str, object]:
    name = spec.value.__name__
    return {
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


def _message(model: type[m.Message]) -> dict[str, object]:
    name = model.__name__
    headers: dict[str, object] = {
        "llmbus-schema": {"type": "string", "const": model.schema_name()},
        "traceparent": {"type": "string", "description": "W3C trace context"},
        "llmbus-request-id": {"type": "string"},
        "llmbus-tenant": {"type": "string"},
    }
    if (ce_type := event_type(model)) is not None:
        headers |= cloudevent_header_schema(ce_type)
    return {
        "name": name,
        "contentType": "application/json",
        "headers": {"type": "object", "properties": headers},
        "payload": {"$ref": f"../messages/{name}.json"},
    }


def _receive(contract: Contract, reads: Reads, channel_id: str) -> dict[str, object]:
    """One subscription as AsyncAPI: its group (or none), where it starts, how it is handled."""
    group = "llmbus." + contract.service + (f".{reads.group}" if reads.group else "")
    handling = f"batches of up to {reads.batch_max_records}" if reads.batch_max_records else "one record at a time"
    if reads.max_in_flight > 1:
        handling = f"up to {reads.max_in_flight} records at once"
        handling += ", committed in offset order" if reads.group is not None else ""
    where = "from the earliest offset" if reads.from_earliest else "from the latest offset"
    if reads.at_start:
        delivery = "nothing committed: read to its end once as the service starts, then not followed"
    elif reads.on_demand:
        delivery = "nothing committed: one key's records read when needed, never followed"
    elif reads.group is None and reads.from_earliest:
        delivery = "nothing committed: read in full at every start, to its end before the service serves"
    elif reads.group is None:
        delivery = "nothing committed: what is written after the service started"
    else:
        delivery = "committed after the handler (at least once)"
    summary = f"{reads.name}: {'no group, every instance reads all' if reads.group is None else 'group ' + group}"
    operation: dict[str, object] = {
        "action": "receive",
        "channel": {"$ref": f"#/channels/{channel_id}"},
        "summary": summary,
        "description": f"{where}; {handling}; {delivery}. {reads.notes}".strip(),
    }
    if reads.group is not None:
        operation["bindings"] = {"kafka": {"groupId": {"type": "string", "const": group}}}
    return operation


def asyncapi_for(contract: Contract) -> dict[str, object]:
    """AsyncAPI 3 document of one service, from its declared subscriptions and publications."""
    channels: dict[str, object] = {}
    operations: dict[str, object] = {}
    components: dict[str, object] = {}

    def channel(topic: str, model: type[m.Message]) -> str:
        channel_id = _channel_id(topic)
        channels[channel_id] = _channel(_spec(topic))
        components[model.__name__] = _message(model)
        return channel_id

    for reads in contract.reads:
        for topic in reads.topics:
            channel_id = channel(topic, reads.model)
            suffix = "" if len(reads.topics) == 1 else f"_{channel_id}"
            operations[f"receive_{reads.name}{suffix}"] = _receive(contract, reads, channel_id)
    for writes in contract.writes:
        channel_id = channel(writes.topic, writes.model)
        operation: dict[str, object] = {"action": "send", "channel": {"$ref": f"#/channels/{channel_id}"}}
        if writes.notes:
            operation["description"] = writes.notes
        operations[f"send_{channel_id}"] = operation
    return {
        "asyncapi": ASYNCAPI_VERSION,
        "info": {
            "title": f"llmbus {contract.service}",
            "version": "1",
            "description": (
                "Generated from the service's declared subscriptions and publications (llmbus.contract.contracts)."
            ),
        },
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
    files["exports/RlhfRecord.json"] = _dump_json(rlhf_schema())
    files["manifest/ModelManifest.json"] = _dump_json(manifest_schema())
    for contract in contracts.SERVICES:
        files[f"asyncapi/{contract.service}.yaml"] = yaml.safe_dump(asyncapi_for(contract), sort_keys=False, width=120)
    return files


def manifest_schema() -> dict[str, object]:
    """The model manifest operators write (`llmbus models register -f`, `llmbus models push --manifest`)."""
    schema: dict[str, object] = {"$id": f"https://llmbus.dev/schemas/manifest/ModelManifest/{MANIFEST_VERSION}"}
    schema.update(ModelManifest.model_json_schema())
    return schema


def rlhf_schema() -> dict[str, object]:
    """The records `llmbus export rlhf` writes (llmbus.archive.rlhf), one JSON object a line."""
    from llmbus.archive.rlhf import RLHF_SCHEMA_VERSION, RlhfRecord

    schema: dict[str, object] = {"$id": f"https://llmbus.dev/schemas/exports/RlhfRecord/{RLHF_SCHEMA_VERSION}"}
    schema.update(RlhfRecord.model_json_schema())
    return schema


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

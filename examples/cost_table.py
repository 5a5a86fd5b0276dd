"""A live per-tenant cost table from llm.costs: the smallest analytics consumer of llmbus.

Plain aiokafka, no llmbus imports: it follows the published contract (schemas/README.md) only.
- Each record is a CloudEvent in Kafka binary mode: `ce_type` says what it is
  (`io.llmbus.cost.v1`), `ce_subject` the tenant, `ce_id` its idempotency id.
- Delivery is at least once: a record seen again (same `ce_id`) is not counted again.
- Fields may be added within a version: read the fields you need, ignore the rest.
- Token usage and model are also under their OpenTelemetry GenAI names (`gen_ai.usage.input_tokens`).
- Money is exact in integer micro-dollars (`cost_micro_usd`); sum those, not the float dollars.

    python examples/cost_table.py --bootstrap 127.0.0.1:9092
    python examples/cost_table.py --username analytics --password ... --group llmbus.analytics.cost-table

It prints the table every --print-every seconds while records arrive, and once more when it stops
(after --max-records records, or --timeout seconds; by default it runs until interrupted).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer

COST_TYPE_PREFIX = "io.llmbus.cost."
WIDTHS = (8, 11, 10, 15, 12)
READS_VERSIONS = {"v1"}  # a newer major version may change what fields mean: refuse to guess


@dataclass
class TenantTotals:
    records: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_micro_usd: int = 0


class CostTable:
    def __init__(self) -> None:
        self.tenants: dict[str, TenantTotals] = {}
        self.seen_ids: set[str] = set()  # a long-running job keeps this bounded (e.g. per day)
        self.duplicates = 0
        self.skipped = 0  # not a cost event, or a version this reader does not know

    def add(self, headers: dict[str, str], value: bytes | None) -> None:
        event_type, event_id = headers.get("ce_type", ""), headers.get("ce_id")
        if headers.get("ce_specversion") != "1.0" or not event_type.startswith(COST_TYPE_PREFIX) or not event_id:
            self.skipped += 1
            return
        if event_type.removeprefix(COST_TYPE_PREFIX) not in READS_VERSIONS or value is None:
            self.skipped += 1
            return
        if event_id in self.seen_ids:
            self.duplicates += 1
            return
        self.seen_ids.add(event_id)
        record = json.loads(value)
        totals = self.tenants.setdefault(headers.get("ce_subject") or record.get("tenant", "?"), TenantTotals())
        totals.records += 1
        # Token usage under its OpenTelemetry GenAI names (gen_ai.usage.input_tokens, ...); a record
        # written before llmbus carried them has only its own fields, which hold the same counts.
        usage = record.get("gen_ai", {}).get("usage", {})
        totals.prompt_tokens += int(usage.get("input_tokens", record.get("prompt_tokens", 0)))
        totals.completion_tokens += int(usage.get("output_tokens", record.get("completion_tokens", 0)))
        totals.cost_micro_usd += int(record.get("cost_micro_usd", 0))

    def render(self) -> str:
        header = ("records", "prompt_tok", "compl_tok", "cost_micro_usd", "cost_usd")
        lines = [f"{'tenant':<24} " + " ".join(f"{name:>{width}}" for name, width in zip(header, WIDTHS, strict=True))]
        for tenant, row in sorted(self.tenants.items()):
            lines.append(
                f"{tenant:<24} {row.records:>8} {row.prompt_tokens:>11} {row.completion_tokens:>10} "
                f"{row.cost_micro_usd:>15} {row.cost_micro_usd / 1e6:>12.6f}"
            )
        lines.append(f"({len(self.seen_ids)} records, {self.duplicates} duplicates dropped, {self.skipped} skipped)")
        return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--topic", default="llm.costs", help="with a namespace, e.g. prod.llm.costs")
    parser.add_argument("--group", default=None, help="consumer group (offsets committed); none: read from the start")
    parser.add_argument("--username", default=None, help="SASL/SCRAM-SHA-512 user, e.g. analytics")
    parser.add_argument("--password", default=None)
    parser.add_argument("--max-records", type=int, default=None, help="stop after this many records read")
    parser.add_argument("--timeout", type=float, default=None, help="stop after this many seconds")
    parser.add_argument("--print-every", type=float, default=2.0, help="seconds between live tables")
    return parser.parse_args(argv)


async def run(args: argparse.Namespace) -> CostTable:
    auth = {}
    if args.username:
        auth = dict(
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="SCRAM-SHA-512",
            sasl_plain_username=args.username,
            sasl_plain_password=args.password or "",
        )
    consumer = AIOKafkaConsumer(
        args.topic,
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        **auth,
    )
    table = CostTable()
    await asyncio.wait_for(consumer.start(), 30)
    started = last_print = time.monotonic()
    read = 0
    try:
        while args.max_records is None or read < args.max_records:
            if args.timeout is not None and time.monotonic() - started >= args.timeout:
                break
            left = None if args.max_records is None else args.max_records - read
            batches = await consumer.getmany(timeout_ms=500, max_records=left)
            for records in batches.values():
                for record in records:
                    table.add({k: v.decode(errors="replace") for k, v in record.headers}, record.value)
                    read += 1
            if batches and args.group:
                await asyncio.wait_for(consumer.commit(), 10)  # after the records are counted
            if batches and time.monotonic() - last_print >= args.print_every:
                print(table.render(), end="\n\n", flush=True)
                last_print = time.monotonic()
    finally:
        await asyncio.wait_for(consumer.stop(), 10)
    return table


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        table = asyncio.run(run(args))
    except KeyboardInterrupt:
        return 130
    print("final:")
    print(table.render(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

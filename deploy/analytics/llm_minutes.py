"""Per-minute windows of llmbus traffic by tenant x model, as a Flink SQL job (PyFlink).

Reads `llm.results` and `llm.costs` (JSON values, CloudEvents binary-mode headers) from Kafka and
writes one row per (minute, tenant, model): requests, errors by code, tokens in/out, cost,
cache-hit share, TTFT p50/p95. Event time is the record's own time (`completed_at_ms` on a
result, `booked_at_ms` on a cost) with a bounded-out-of-orderness watermark. Delivery is at least
once, so each record counts once per record id (`ce_id`): a windowed deduplication, exact because
copies of one record carry the same event time and so fall in the same window.

    # bounded: everything up to the latest offsets now, rows printed as JSON lines, then exit
    python deploy/analytics/llm_minutes.py --results-topic llm.results --costs-topic llm.costs --bounded
    # unbounded, rows appended to a Kafka topic (the job a Flink cluster runs: deploy/analytics/README.md)
    python deploy/analytics/llm_minutes.py --sink-topic llm.analytics.minutes --group llmbus.analytics.flink

No llmbus imports: it follows the published contract (schemas/README.md) only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from pyflink.table import EnvironmentSettings, Schema, TableDescriptor, TableEnvironment

JARS_DIR = Path(os.environ.get("LLMBUS_FLINK_JARS", Path.home() / ".cache/llmbus/flink/jars"))


def client_options(args: argparse.Namespace) -> dict[str, str]:
    """The broker and, on the secured broker, the SASL/SCRAM login: for the sources and the sink."""
    options = {"connector": "kafka", "properties.bootstrap.servers": args.bootstrap}
    if args.username:
        options |= {
            "properties.security.protocol": "SASL_PLAINTEXT",
            "properties.sasl.mechanism": "SCRAM-SHA-512",
            "properties.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{args.username}" password="{args.password or ""}";',
        }
    return options


def source_options(args: argparse.Namespace, topic: str) -> str:
    options = client_options(args) | {
        "topic": topic,
        "scan.startup.mode": "earliest-offset" if args.group is None else "group-offsets",
        "properties.auto.offset.reset": "earliest",
        "format": "json",
        "json.ignore-parse-errors": "true",  # a record that is not JSON is skipped, not a failed job
        "json.fail-on-missing-field": "false",  # fields are added within a version: read what we need
    }
    if args.group is not None:
        options["properties.group.id"] = args.group
    if args.bounded:
        options["scan.bounded.mode"] = "latest-offset"
    return ",\n".join(f"'{k}' = '{v}'" for k, v in options.items())


def source_ddl(args: argparse.Namespace) -> list[str]:
    watermark = f"event_time - INTERVAL '{args.watermark_delay_s}' SECOND"
    results = f"""
        CREATE TABLE results (
          request_id STRING, `tenant` STRING, `model` STRING, `status` STRING, `cached` BOOLEAN, `shadow` BOOLEAN,
          completed_at_ms BIGINT,
          `error` ROW<code STRING>,
          `usage` ROW<prompt_tokens BIGINT, cached_prompt_tokens BIGINT, completion_tokens BIGINT>,
          `timings` ROW<ttft_ms DOUBLE>,
          headers MAP<STRING, BYTES> METADATA,
          kafka_time TIMESTAMP_LTZ(3) METADATA FROM 'timestamp',
          event_time AS COALESCE(TO_TIMESTAMP_LTZ(completed_at_ms, 3), kafka_time),
          WATERMARK FOR event_time AS {watermark}
        ) WITH ({source_options(args, args.results_topic)})"""
    costs = f"""
        CREATE TABLE costs (
          record_id STRING, request_id STRING, `tenant` STRING, `model` STRING, `kind` STRING, booked_to STRING,
          `shadow` BOOLEAN, booked_at_ms BIGINT, cost_micro_usd BIGINT,
          headers MAP<STRING, BYTES> METADATA,
          kafka_time TIMESTAMP_LTZ(3) METADATA FROM 'timestamp',
          event_time AS COALESCE(TO_TIMESTAMP_LTZ(booked_at_ms, 3), kafka_time),
          WATERMARK FOR event_time AS {watermark}
        ) WITH ({source_options(args, args.costs_topic)})"""
    return [results, costs]


# One stream of facts: a result or a cost, each with its record id. Only CloudEvents of a version
# this job reads (v1) count; a newer major version may change what fields mean.
FACTS = """
CREATE TEMPORARY VIEW facts AS
SELECT 'result' AS `source`, COALESCE(CAST(headers['ce_id'] AS STRING), request_id) AS record_id,
       `tenant`, `model`, event_time,
       COALESCE(`shadow`, FALSE) AS `shadow`, `status` = 'error' AS failed, `error`.code AS error_code,
       COALESCE(`cached`, FALSE) AS `cached`,
       `usage`.prompt_tokens AS prompt_tokens, `usage`.completion_tokens AS completion_tokens,
       `timings`.ttft_ms AS ttft_ms,
       CAST(NULL AS STRING) AS booked_to, CAST(NULL AS BIGINT) AS cost_micro_usd
FROM results
WHERE CAST(headers['ce_type'] AS STRING) = 'io.llmbus.result.v1'
UNION ALL
SELECT 'cost', COALESCE(CAST(headers['ce_id'] AS STRING), record_id, request_id),
       `tenant`, `model`, event_time,
       COALESCE(`shadow`, FALSE), FALSE, CAST(NULL AS STRING), `kind` = 'cache',
       CAST(NULL AS BIGINT), CAST(NULL AS BIGINT), CAST(NULL AS DOUBLE),
       booked_to, cost_micro_usd
FROM costs
WHERE CAST(headers['ce_type'] AS STRING) = 'io.llmbus.cost.v1'
"""

# At-least-once delivery: keep the first copy of each record id within its minute.
UNIQUE_FACTS = """
CREATE TEMPORARY VIEW unique_facts AS
SELECT * FROM (
  SELECT *, ROW_NUMBER() OVER (PARTITION BY window_start, window_end, `source`, record_id ORDER BY event_time) AS `copy`
  FROM TABLE(TUMBLE(TABLE facts, DESCRIPTOR(event_time), INTERVAL '1' MINUTE))
) WHERE `copy` = 1
"""

# The minute is the deduplication's window (window_time is its rowtime): a legacy group window on it.
MINUTE_SUMS = """
SELECT TUMBLE_START(window_time, INTERVAL '1' MINUTE) AS window_start,
       TUMBLE_END(window_time, INTERVAL '1' MINUTE) AS window_end,
       `tenant`, `model`,
       COUNT(*) FILTER (WHERE `source` = 'result' AND NOT `shadow`) AS requests,
       COUNT(*) FILTER (WHERE `source` = 'result' AND `shadow`) AS shadow_requests,
       COUNT(*) FILTER (WHERE `source` = 'result' AND failed) AS errors,
       COLLECT(error_code) AS errors_by_code,
       COALESCE(SUM(prompt_tokens), 0) AS prompt_tokens,
       COALESCE(SUM(completion_tokens), 0) AS completion_tokens,
       COALESCE(SUM(cost_micro_usd) FILTER (WHERE booked_to = 'tenant'), 0) AS cost_micro_usd,
       COALESCE(SUM(cost_micro_usd) FILTER (WHERE booked_to = 'experiment'), 0) AS experiment_cost_micro_usd,
       COALESCE(SUM(cost_micro_usd) FILTER (WHERE booked_to = 'platform'), 0) AS platform_cost_micro_usd,
       CAST(COUNT(*) FILTER (WHERE `source` = 'result' AND `cached`) AS DOUBLE)
         / NULLIF(COUNT(*) FILTER (WHERE `source` = 'result'), 0) AS cache_hit_share,
       ARRAY_SORT(ARRAY_AGG(ttft_ms) FILTER (WHERE ttft_ms IS NOT NULL)) AS ttfts_ms
FROM unique_facts
GROUP BY TUMBLE(window_time, INTERVAL '1' MINUTE), `tenant`, `model`
"""

# TTFT percentiles by nearest rank (exact: the p-th value of the minute's sorted TTFTs).
MINUTES = f"""
SELECT window_start, window_end, `tenant`, `model`, requests, shadow_requests, errors, errors_by_code,
       prompt_tokens, completion_tokens, cost_micro_usd, experiment_cost_micro_usd, platform_cost_micro_usd,
       cache_hit_share,
       CASE WHEN CARDINALITY(ttfts_ms) > 0 THEN ttfts_ms[CAST(CEIL(0.50 * CARDINALITY(ttfts_ms)) AS INT)] END
         AS ttft_p50_ms,
       CASE WHEN CARDINALITY(ttfts_ms) > 0 THEN ttfts_ms[CAST(CEIL(0.95 * CARDINALITY(ttfts_ms)) AS INT)] END
         AS ttft_p95_ms
FROM ({MINUTE_SUMS})
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--results-topic", default="llm.results", help="with a namespace, e.g. prod.llm.results")
    parser.add_argument("--costs-topic", default="llm.costs")
    parser.add_argument("--group", default=None, help="consumer group (resume from its offsets); none: from the start")
    parser.add_argument("--bounded", action="store_true", help="stop at the latest offsets as of the start")
    parser.add_argument("--sink-topic", default=None, help="append rows (JSON) to this topic; default: print them")
    parser.add_argument("--watermark-delay-s", type=int, default=60, help="how late a record may come")
    parser.add_argument("--idle-timeout-s", type=int, default=30, help="a partition silent this long holds no one")
    parser.add_argument("--parallelism", type=int, default=1)
    parser.add_argument("--username", default=None, help="SASL/SCRAM-SHA-512 user, e.g. analytics")
    parser.add_argument("--password", default=None)
    return parser.parse_args(argv)


def table_env(args: argparse.Namespace) -> TableEnvironment:
    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    config = env.get_config()
    jars = sorted(JARS_DIR.glob("*.jar"))
    if jars:  # on a cluster the connector is in the image's lib/ instead (README.md)
        config.set("pipeline.jars", ";".join(jar.as_uri() for jar in jars))
    config.set("parallelism.default", str(args.parallelism))
    config.set("table.exec.source.idle-timeout", f"{args.idle_timeout_s} s")
    config.set("table.local-time-zone", "UTC")
    for ddl in source_ddl(args):
        env.execute_sql(ddl)
    env.execute_sql(FACTS)
    env.execute_sql(UNIQUE_FACTS)
    return env


def row_json(names: list[str], row: object) -> str:
    out = {}
    for name, value in zip(names, row, strict=True):  # type: ignore[call-overload]
        out[name] = value.isoformat() if hasattr(value, "isoformat") else value
    return json.dumps(out, sort_keys=True, default=str)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    env = table_env(args)
    minutes = env.sql_query(MINUTES)
    if args.sink_topic:
        sink = TableDescriptor.for_connector("kafka").schema(
            Schema.new_builder().from_row_data_type(minutes.get_schema().to_row_data_type()).build()
        )
        for key, value in (client_options(args) | {"topic": args.sink_topic}).items():
            if key != "connector":
                sink = sink.option(key, value)
        sink = sink.format("json")
        env.create_temporary_table("minutes_sink", sink.build())
        minutes.execute_insert("minutes_sink").wait()
        return 0
    names = minutes.get_schema().get_field_names()
    with minutes.execute().collect() as rows:
        for row in rows:
            print(row_json(names, row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

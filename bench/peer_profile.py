"""CPU-clock profiles of the llmbus path under the peer benchmark's load, and what the bus carried per request.

Each service runs with LLMBUS_CPU_PROFILE (llmbus.observability.profiling: yappi, CPU clock). Around
each concurrency's window the bench sends SIGUSR1 (a window starts) and SIGUSR2 (it ends; the service
writes `<service>-<pid>.window-<n>.pstat`), so a profile holds that load and nothing of the start-up.
The broker's and Redis's CPU come from their process times over the same window; Kafka records per
request from the namespace's end offsets before and after (by topic), Redis commands per request
from `INFO commandstats` (a shared Redis counts everyone's).

    python -m bench.peer_bench --profile ...    # writes bench/reports/peer_profile.json and the
                                                # tables of bench/reports/peer_profile.md
"""

from __future__ import annotations

import asyncio
import os
import pstats
import re
import subprocess
import time
from collections import Counter
from pathlib import Path

import psutil
from aiokafka import AIOKafkaConsumer, TopicPartition

from bench.cpu_profile_summary import package_of
from llmbus.bus.admin import topics_matching
from llmbus.observability.profiling import WINDOW_END, WINDOW_START
from llmbus.settings import BusSettings

TABLES_BEGIN = "<!-- profile-tables -->"
TABLES_END = "<!-- /profile-tables -->"
TOP_FUNCTIONS = 12


async def end_offsets(settings: BusSettings) -> dict[str, int]:
    """Records written so far to each topic of the namespace (end offsets summed over partitions)."""
    names = await topics_matching(settings, re.compile(re.escape(settings.topic_prefix)))
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap, enable_auto_commit=False)
    await asyncio.wait_for(consumer.start(), settings.admin_timeout_s)
    try:
        partitions = [TopicPartition(name, p) for name in names for p in (consumer.partitions_for_topic(name) or set())]
        if not partitions:  # metadata not loaded for these topics yet
            await asyncio.wait_for(consumer._client.force_metadata_update(), settings.admin_timeout_s)
            partitions = [
                TopicPartition(name, p) for name in names for p in (consumer.partitions_for_topic(name) or set())
            ]
        offsets = await asyncio.wait_for(consumer.end_offsets(partitions), settings.admin_timeout_s)
    finally:
        await asyncio.wait_for(consumer.stop(), settings.stop_timeout_s)
    totals: Counter[str] = Counter()
    for tp, offset in offsets.items():
        totals[tp.topic.removeprefix(settings.topic_prefix)] += offset
    return dict(totals)


def redis_commands(redis_url: str) -> dict[str, int]:
    """Calls per Redis command since the server started (`INFO commandstats`)."""
    info = subprocess.run(
        ["redis-cli", "-u", redis_url, "INFO", "commandstats"], capture_output=True, text=True, timeout=30
    )
    calls = {}
    for found in re.finditer(r"cmdstat_([a-z|_-]+):calls=(\d+)", info.stdout):
        calls[found.group(1)] = int(found.group(2))
    return calls


def per_request(before: dict[str, int], after: dict[str, int], requests: int) -> dict[str, float]:
    """What grew between two snapshots, per request, largest first; `info`-style reads of ours excluded."""
    grown = {k: (after.get(k, 0) - before.get(k, 0)) / max(1, requests) for k in after}
    return {k: round(v, 2) for k, v in sorted(grown.items(), key=lambda kv: -kv[1]) if v > 0 and k != "info"}


MONITOR_CLIENT = re.compile(r"^[0-9.]+ \[\d+ (?:[0-9.]+:(\d+)|(lua))\] (.*)$")
QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')


def redis_calls_by_role(monitor_output: str, port_roles: dict[int, str], prefix: str) -> Counter[str]:
    """`redis-cli MONITOR` lines counted by (role of the client's port, command, key shape): ids and
    hashes in keys become `*`, the namespace prefix is dropped; a script is named by its first key.
    A Lua script's own calls are counted too, as `lua` (MONITOR lists them after its EVALSHA)."""
    calls: Counter[str] = Counter()
    for line in monitor_output.splitlines():
        found = MONITOR_CLIENT.match(line)
        if found is None:
            continue
        role = "lua" if found.group(2) else port_roles.get(int(found.group(1)))
        args = QUOTED.findall(found.group(3))
        if role is None or not args:
            continue
        command = args[0].lower()
        key = args[3] if command in ("evalsha", "eval") and len(args) > 3 and args[2] != "0" else ""
        key = key or (args[1] if len(args) > 1 and command not in ("evalsha", "eval") else "")
        calls[f"{role} {command} {_shape(key, prefix)}".rstrip()] += 1
    return calls


def _shape(key: str, prefix: str) -> str:
    key = key.replace(prefix, "<ns>")
    return re.sub(r"[0-9a-f]{12,}|(?<![a-z])\d+", "*", key)[:80]


def client_ports(roles: dict[str, int]) -> dict[int, str]:
    """Local TCP ports of each role's connections (to tell MONITOR's clients apart)."""
    ports = {}
    for role, pid in roles.items():
        try:
            connections = psutil.Process(pid).net_connections(kind="tcp")
        except psutil.NoSuchProcess:
            continue
        for conn in connections:
            if conn.laddr:
                ports[conn.laddr.port] = role
    return ports


def start_windows(pids: dict[str, int]) -> None:
    for pid in pids.values():
        os.kill(pid, WINDOW_START)


def end_windows(pids: dict[str, int], window: int, profile_dir: Path, dest: Path, timeout_s: float = 60) -> None:
    """SIGUSR2 to every profiled service, then its window's file moved to `dest/<role>.pstat`."""
    for pid in pids.values():
        os.kill(pid, WINDOW_END)
    dest.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    for role, pid in pids.items():
        while not (found := list(profile_dir.glob(f"*-{pid}.window-{window}.pstat"))):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{role} (pid {pid}) wrote no profile window {window}")
            time.sleep(0.2)
        found[0].rename(dest / f"{role}.pstat")


def summarise_profile(path: Path, requests: int) -> dict[str, object]:
    """Own CPU time by package and the functions with the most own time, with calls per request."""
    stats = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
    total = sum(entry[2] for entry in stats.values()) or 1.0
    packages: Counter[str] = Counter()
    for (filename, _, name), entry in stats.items():
        packages[package_of(filename if filename != "~" else name)] += entry[2]
    top = sorted(stats.items(), key=lambda kv: -kv[1][2])[:TOP_FUNCTIONS]
    return {
        "profiled_cpu_s": round(total, 3),
        "packages": {label: round(100 * s / total, 1) for label, s in packages.most_common()},
        "top_functions": [
            {
                "function": f"{Path(filename).name}:{line} {name}" if filename != "~" else name,
                "own_share_pct": round(100 * entry[2] / total, 1),
                "cumulative_share_pct": round(100 * entry[3] / total, 1),
                "calls_per_request": round(entry[1] / max(1, requests), 2),
            }
            for (filename, line, name), entry in top
        ],
    }


def _function_rows(summary: dict[str, object]) -> list[str]:
    rows = []
    for f in summary["top_functions"]:  # type: ignore[attr-defined]
        rows.append(
            f"| `{f['function']}` | {f['own_share_pct']} % | {f['cumulative_share_pct']} % | {f['calls_per_request']} |"
        )
    return rows


def markdown_tables(profile: dict[str, object]) -> str:
    """The generated part of peer_profile.md: per concurrency, each process's CPU and where it goes."""
    lines = [TABLES_BEGIN, "", f"Generated by `{profile['command']}` ({profile['started']}).", ""]
    for window in profile["windows"]:  # type: ignore[attr-defined]
        c, n = window["concurrency"], window["requests"]
        lines += [
            f"### c = {c} ({n} requests, load average {window['loadavg_1min'][0]} → {window['loadavg_1min'][1]})",
            "",
        ]
        lines += ["CPU per request by process (ms; profiled services run about 4x slower under yappi):", ""]
        lines += [
            "| " + " | ".join(window["cpu_ms_per_request"]) + " |",
            "|" + "---|" * len(window["cpu_ms_per_request"]),
        ]
        lines += ["| " + " | ".join(str(v) for v in window["cpu_ms_per_request"].values()) + " |", ""]
        lines += [f"Kafka records per request, by topic: {window['kafka_records_per_request']}", ""]
        lines += [f"Redis commands per request: {window['redis_commands_per_request']}", ""]
        roles = list(window["profiles"])
        labels = sorted(
            {label for p in window["profiles"].values() for label in p["packages"]},
            key=lambda label: -max(p["packages"].get(label, 0.0) for p in window["profiles"].values()),
        )
        lines += ["| own CPU in | " + " | ".join(roles) + " |", "|---|" + "---|" * len(roles)]
        for label in labels:
            cells = [f"{window['profiles'][r]['packages'].get(label, 0.0)} %" for r in roles]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
        for role in roles:
            lines += [
                f"{role}, top functions by own CPU:",
                "",
                "| function | own | incl. callees | calls per request |",
                "|---|---|---|---|",
                *_function_rows(window["profiles"][role]),
                "",
            ]
    by_service = profile.get("redis_calls_per_request_by_service") or {}
    if by_service:
        lines += ["### Redis commands per request, by service (MONITOR, one request at a time)", ""]
        lines += ["| service, command, key | per request |", "|---|---|"]
        lines += [f"| `{call}` | {n} |" for call, n in by_service.items()]  # type: ignore[attr-defined]
        lines.append("")
    lines.append(TABLES_END)
    return "\n".join(lines)


def update_page(page: Path, tables: str) -> None:
    """Replace the generated tables of `page` (between the markers), keeping the written analysis."""
    text = page.read_text() if page.exists() else f"# Profiles of the llmbus path\n\n{TABLES_BEGIN}\n{TABLES_END}\n"
    if TABLES_BEGIN not in text:
        text += f"\n{TABLES_BEGIN}\n{TABLES_END}\n"
    head, rest = text.split(TABLES_BEGIN, 1)
    tail = rest.split(TABLES_END, 1)[1] if TABLES_END in rest else ""
    page.write_text(head + tables + tail)

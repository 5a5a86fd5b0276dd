"""Where each service's CPU goes, by package: a table from the services' CPU-time profiles.

    LLMBUS_CPU_PROFILE=/tmp/prof python -m bench.pipeline_bench --engines sim --concurrency 64 ...
    python -m bench.cpu_profile_summary /tmp/prof

Each service started with LLMBUS_CPU_PROFILE writes `<service>-<pid>.pstat` at exit
(llmbus.observability.profiling: yappi, CPU clock). This sums each function's own time (not its callees')
by the package its code lives in, so the shares add up to 100 % of the profiled CPU. Start-up
(imports) is in the profile too; under load it is a small part. yappi slows a service about
fourfold, more so for many small calls: read the shares as where to look, not as costs.
"""

from __future__ import annotations

import argparse
import pstats
import sys
from collections import Counter
from pathlib import Path

# Third-party code is labelled by its package under site-packages (these names, else the package's
# own); the rest by the first marker that is part of its path, or of a builtin's name (a builtin has
# no file). A service's code is found under services/<name>/ or, run from a checkout's import path,
# llmbus_services/<name>/. Checked in that order: a venv may live under a directory called llmbus.
SITE_PACKAGES = {
    "aiokafka": "aiokafka",
    "redis": "redis-py",
    "pydantic": "pydantic",
    "pydantic_core": "pydantic",
    "opentelemetry": "opentelemetry",
    "prometheus_client": "prometheus_client",
    "uvloop": "uvloop",
}
PACKAGES: tuple[tuple[str, str], ...] = (
    ("pydantic", "pydantic"),
    ("uvloop", "uvloop"),
    ("asyncio (stdlib)", "/asyncio/"),
    ("llmbus.bus (consume/publish)", "/llmbus/bus/"),
    ("llmbus.state (Redis markers, batching)", "/llmbus/state/"),
    ("llmbus.contract (messages, chunks)", "/llmbus/contract/"),
    ("llmbus (other shared code)", "/llmbus/"),
    ("sim engine", "/engines/sim/"),
    ("engine-worker", "services/engine_worker/"),
    ("scheduler", "services/scheduler/"),
    ("router", "services/router/"),
    ("gateway", "services/gateway/"),
    ("json (stdlib)", "/json/"),
)
BUILTINS = "builtins (len, isinstance, str and bytes methods, ...)"


def package_of(filename: str) -> str:
    """The label of a function's code (its file, or a builtin's name)."""
    if "/site-packages/" in filename:
        top = filename.split("/site-packages/", 1)[1].split("/", 1)[0].removesuffix(".py")
        return SITE_PACKAGES.get(top, top)
    for label, marker in PACKAGES:
        if marker in filename:
            return label
    if "/lib/python3" in filename:
        return "other stdlib"
    return "other code" if filename.startswith("/") else BUILTINS


def shares(path: Path) -> tuple[float, Counter[str]]:
    stats = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
    by_package: Counter[str] = Counter()
    for (filename, _, name), entry in stats.items():
        by_package[package_of(filename if filename != "~" else name)] += entry[2]  # own time
    total = sum(by_package.values())
    return total, by_package


def table(directory: Path) -> str:
    profiles = sorted(directory.glob("*.pstat"))
    if not profiles:
        raise SystemExit(f"no *.pstat in {directory}")
    columns = {p.stem.rsplit("-", 1)[0]: shares(p) for p in profiles}
    labels = sorted(
        {label for _, counts in columns.values() for label in counts},
        key=lambda label: -max(counts[label] / total for total, counts in columns.values()),
    )
    lines = ["| own CPU time in | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for label in labels:
        cells = [f"{100 * counts[label] / total:.1f} %" for total, counts in columns.values()]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines.append("| (profiled CPU-seconds) | " + " | ".join(f"{total:.1f}" for total, _ in columns.values()) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", type=Path)
    args = parser.parse_args(argv)
    print(table(args.directory))
    return 0


if __name__ == "__main__":
    sys.exit(main())

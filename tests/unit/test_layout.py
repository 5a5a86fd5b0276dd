"""The service layout and the dependency arrows (docs/architecture.md, "Code layout"), read with ast.

- every service has app.py (wiring: declarations and a short main()), config.py, flows/ (what
  each record or request sets going), core/ (pure), and nothing at its top level but those; I/O
  lives in adapters/, configuration files in policies/; a flow file keeps to one job (under 400 lines);
- libs/ imports no service and no offline tool; no service imports another service, the CLI or
  the offline tools;
- core/ imports no transport, Redis, HTTP or metrics client, and none of its service's outer layers;
- no benchmark and no offline tool imports tests: what both need is in llmbus_tools/harness/.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SERVICES = sorted(p.parent.name for p in (REPO / "services").glob("*/__main__.py"))
PACKAGE = "llmbus_services"  # the import name of the folder services/ (setup.py)
TOP_MODULES = {"__init__.py", "__main__.py", "app.py", "config.py"}
FOLDERS = {"core", "adapters", "flows", "policies"}
FLOW_MAX_LINES = 400
MAIN_MAX_LINES = 25
# What a core module may not import: transport, Redis, HTTP, metrics, Kubernetes, and the llmbus
# modules that wrap them.
NOT_IN_CORE = (
    "aiokafka",
    "redis",
    "httpx",
    "fastapi",
    "starlette",
    "uvicorn",
    "prometheus_client",
    "kubernetes",
    "opentelemetry",
    "llmbus.bus",
    "llmbus.state.store",
    "llmbus.state.redis_batch",
    "llmbus.state.fencing",
    "llmbus.client",
    "llmbus.bus.replies",
    "llmbus.cli",
)


def imports(path: Path) -> set[str]:
    """Every absolute module name a file imports (`from a.b import c` gives a.b and a.b.c)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def sources(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def test_there_are_services() -> None:
    assert len(SERVICES) >= 8, SERVICES


@pytest.mark.parametrize("service", SERVICES)
def test_service_has_the_layout(service: str) -> None:
    root = REPO / "services" / service
    for required in ("app.py", "config.py", "flows/__init__.py", "core/__init__.py", "README.md"):
        assert (root / required).is_file(), f"services/{service}/{required} missing"
    top = {p.name for p in root.iterdir() if p.is_file() and p.suffix == ".py"}
    assert top <= TOP_MODULES, f"services/{service}: {sorted(top - TOP_MODULES)} belong in core/ or adapters/"
    folders = {p.name for p in root.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders <= FOLDERS, f"services/{service}: folders {sorted(folders - FOLDERS)} (only {sorted(FOLDERS)})"
    for folder in ("core", "adapters", "flows"):
        for package in [root / folder, *(root / folder).rglob("*")]:
            if package.is_dir() and package.name != "__pycache__" and any(package.glob("*.py")):
                assert (package / "__init__.py").is_file(), f"{package.relative_to(REPO)} is not a package"


@pytest.mark.parametrize("service", SERVICES)
def test_configuration_files_are_in_policies(service: str) -> None:
    root = REPO / "services" / service
    stray = [
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and p.suffix not in {".py", ".md", ".pyc"} and "policies" not in p.relative_to(root).parts
    ]
    assert not stray, f"services/{service}: configuration and data files belong in policies/: {stray}"


def test_libs_import_no_service_and_no_tool() -> None:
    wrong = {
        f"{path.relative_to(REPO)}: {name}"
        for path in sources(REPO / "libs")
        for name in imports(path)
        if within(name, PACKAGE) or within(name, "llmbus_tools")
    }
    assert not wrong, sorted(wrong)


@pytest.mark.parametrize("service", SERVICES)
def test_service_imports_no_other_service_no_cli_no_tool(service: str) -> None:
    wrong = {
        f"{path.relative_to(REPO)}: {name}"
        for path in sources(REPO / "services" / service)
        for name in imports(path)
        if (within(name, PACKAGE) and name != PACKAGE and not within(name, f"{PACKAGE}.{service}"))
        or within(name, "llmbus.cli")
        or within(name, "llmbus_tools")
    }
    assert not wrong, sorted(wrong)


@pytest.mark.parametrize("service", SERVICES)
def test_core_is_pure(service: str) -> None:
    outer = [f"{PACKAGE}.{service}.{layer}" for layer in ("adapters", "flows", "app")]
    wrong = {
        f"{path.relative_to(REPO)}: {name}"
        for path in sources(REPO / "services" / service / "core")
        for name in imports(path)
        if any(within(name, banned) for banned in (*NOT_IN_CORE, *outer))
    }
    assert not wrong, sorted(wrong)


@pytest.mark.parametrize("service", SERVICES)
def test_flows_keep_to_one_job_and_main_is_short(service: str) -> None:
    """app.py is declarations and a main() that runs them (llmbus.bus.service does the rest)."""
    root = REPO / "services" / service
    long = {
        str(p.relative_to(REPO)): n
        for p in sources(root / "flows")
        if (n := len(p.read_text().splitlines())) > FLOW_MAX_LINES
    }
    assert not long, f"a flow file over {FLOW_MAX_LINES} lines does more than one job: {long}"
    tree = ast.parse((root / "app.py").read_text())
    [main] = [n for n in tree.body if isinstance(n, ast.AsyncFunctionDef) and n.name == "main"]
    assert main.end_lineno is not None and main.end_lineno - main.lineno + 1 <= MAIN_MAX_LINES, service


@pytest.mark.parametrize("folder", ["bench", "llmbus_tools"])
def test_bench_and_tools_import_no_tests(folder: str) -> None:
    wrong = {
        f"{path.relative_to(REPO)}: {name}"
        for path in sources(REPO / folder)
        for name in imports(path)
        if within(name, "tests")
    }
    assert sources(REPO / folder), folder
    assert not wrong, sorted(wrong)


def test_imports_reads_every_form(tmp_path: Path) -> None:
    """The checker's own reader: plain, dotted, from-imports and function-level imports all count."""
    module = tmp_path / "m.py"
    module.write_text("import a.b\nfrom c import d\n\ndef f():\n    from e.f import g\nfrom . import rel\n")
    assert imports(module) == {"a.b", "c", "c.d", "e.f", "e.f.g"}

"""The shared library's roles import each other in one direction only (read from the source, not run).

contract (messages, topics, declarations) is the bottom: every other role may read it and it reads
nothing of llmbus. State, security, observability and domain rules sit on it; the bus on those; the
client and the CLI on top. Nothing in libs/ imports a service, except the CLI through the few
entry points listed below.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

LIB = Path(__file__).resolve().parents[2] / "libs" / "common" / "llmbus"

# role -> the roles it may import (itself always allowed)
ALLOWED: dict[str, set[str]] = {
    "settings": set(),
    "contract": set(),
    "tokens": set(),
    "observability": {"settings"},
    "security": {"contract", "settings", "state"},  # API keys are kept in Redis
    "domain": {"contract"},
    "node": {"contract", "domain"},  # the NVML probe and its gauges: the node agent's and a worker's fallback
    "archive": {"contract", "settings"},  # its default root is under the cache root
    "artifacts": {"contract", "settings"},  # the object store, the node's cache, push and fetch
    "state": {"contract", "settings", "observability"},
    "bus": {"contract", "security", "observability", "settings", "process", "state"},  # state: errors classified
    "audit": {"contract", "bus", "settings"},
    "process": {"settings"},
    "client": {"contract", "bus", "security", "settings"},
    "cli": {"contract", "tokens", "observability", "security", "domain", "archive", "state", "bus", "audit"}
    | {"process", "client", "settings", "artifacts"},
}
# Modules allowed one more role than their own role's: schemagen writes every published schema,
# the RLHF export's (llmbus.archive.rlhf) among them.
EXTRA: dict[str, set[str]] = {"llmbus.contract.schemagen": {"archive"}}
# The CLI's commands that still reach into a service (issue 25: through public entry points only).
CLI_SERVICE_IMPORTS = {
    "llmbus_services.cost_accounting.core.planner",
    "llmbus_services.cost_accounting.core.prices",
    "llmbus_tools.plan_report",
    "llmbus_tools.cost_report",
    "llmbus_tools.router_training.retrain",
}


def _role(module: str) -> str:
    """llmbus.bus.producer -> bus; llmbus.settings -> settings."""
    return module.split(".")[1]


def _module_of(path: Path) -> str:
    parts = path.relative_to(LIB.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every module `path` imports, at the top or inside a function (lazy imports count too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            assert node.level == 0, f"{path}: relative import"
            found.add(node.module)
            if node.module == "llmbus":  # `from llmbus import topics` names a module, not an attribute
                found.update(f"llmbus.{alias.name}" for alias in node.names if alias.name != "__version__")
    return found


def _library_files() -> list[Path]:
    return sorted(p for p in LIB.rglob("*.py") if p.name != "__init__.py" or p.parent != LIB)


def test_every_library_module_has_a_known_role() -> None:
    roles = {_role(_module_of(p)) for p in _library_files()}
    assert roles <= set(ALLOWED), f"modules outside any role: {sorted(roles - set(ALLOWED))}"
    flat = sorted(p.name for p in LIB.glob("*.py") if p.name != "__init__.py")
    assert flat == ["client.py", "settings.py"], f"new flat modules belong in a role package: {flat}"


@pytest.mark.parametrize("path", _library_files(), ids=lambda p: str(p.relative_to(LIB)))
def test_imports_go_down_the_layers_only(path: Path) -> None:
    module = _module_of(path)
    role = _role(module)
    wrong = []
    for imported in sorted(_imports(path)):
        top = imported.split(".")[0]
        if top == "llmbus_services":
            if role != "cli" or imported not in CLI_SERVICE_IMPORTS:
                wrong.append(f"{imported} (libs/ never imports a service)")
        elif top == "llmbus" and imported != "llmbus":
            target = _role(imported)
            if target != role and target not in ALLOWED[role] | EXTRA.get(module, set()):
                wrong.append(f"{imported} ({role} may import only {sorted(ALLOWED[role] | {role})})")
    assert not wrong, f"{module} imports against the layers: {wrong}"


def test_the_checker_sees_lazy_and_from_llmbus_imports(tmp_path: Path) -> None:
    """The AST walk finds an import inside a function and `from llmbus import x` as module llmbus.x
    (x a name that no move map rewrites: settings stays where it is)."""
    source = tmp_path / "probe.py"
    source.write_text("from llmbus import settings as s\n\ndef f():\n    import llmbus_services.router.app\n")
    assert {"llmbus", "llmbus.settings", "llmbus_services.router.app"} <= _imports(source)

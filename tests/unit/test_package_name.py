"""The services install as `llmbus_services`, a name that cannot collide in a user's environment
(docs/architecture.md, "Code layout"): the folder services/ maps onto it in setup.py, a checkout
reaches it through scripts/pythonpath/, and no code still names the old top-level `services`."""

from __future__ import annotations

import ast
import importlib.util
import re
import runpy
from pathlib import Path
from typing import Any

import pytest
import setuptools

from llmbus.process.launch import CHECKOUT_IMPORT_ROOTS, checkout_pythonpath

REPO = Path(__file__).resolve().parents[2]
PACKAGE = "llmbus_services"
CODE_FOLDERS = ("libs", "services", "llmbus_tools", "tests", "bench", "deploy")
# `services.<name>` as a whole string: a module name handed to `python -m` or a launcher.
OLD_MODULE = re.compile(r"^services(\.\w+)+$")
OLD_COMMAND = re.compile(r"(?<![\w./-])-m\"?,? *\"?services\.\w")


def setup_arguments(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What setup.py hands to setuptools.setup, without building anything."""
    captured: dict[str, Any] = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kwargs: captured.update(kwargs))
    monkeypatch.chdir(REPO)
    runpy.run_path(str(REPO / "setup.py"))
    return captured


def test_the_services_folder_installs_as_llmbus_services_only(monkeypatch: pytest.MonkeyPatch) -> None:
    arguments = setup_arguments(monkeypatch)
    packages = set(arguments["packages"])
    assert arguments["package_dir"][PACKAGE] == "services"
    assert {p.split(".")[0] for p in packages} == {"llmbus", PACKAGE, "llmbus_tools"}
    folders = {
        ".".join((PACKAGE, *p.parent.relative_to(REPO / "services").parts)).rstrip(".")
        for p in (REPO / "services").rglob("__init__.py")
    }
    assert folders <= packages, sorted(folders - packages)
    policies = {f"{PACKAGE}.{p.parent.name}.policies" for p in (REPO / "services").glob("*/policies")}
    assert policies <= packages, "policy folders ship as package data"


def test_a_checkout_imports_its_own_services_folder() -> None:
    """The link in scripts/pythonpath/ is the folder, and this run imports this tree's services (an
    editable install of another checkout would not): PYTHONPATH as checkout_pythonpath gives it."""
    assert (REPO / "scripts" / "pythonpath" / PACKAGE).resolve() == REPO / "services"
    spec = importlib.util.find_spec(PACKAGE)
    found = spec.origin if spec else "nowhere"
    assert spec and spec.origin and Path(spec.origin).resolve() == REPO / "services" / "__init__.py", (
        f"{PACKAGE} comes from {found}: set PYTHONPATH={checkout_pythonpath(REPO)}"
    )
    assert [Path(p) for p in checkout_pythonpath(REPO).split(":")] == [REPO / r for r in CHECKOUT_IMPORT_ROOTS]


def test_a_tree_from_before_the_rename_is_refused(tmp_path: Path) -> None:
    """Its children would import the installed llmbus_services, not its own code."""
    (tmp_path / "services").mkdir()
    with pytest.raises(ValueError, match="before the rename"):
        checkout_pythonpath(tmp_path)


def python_files() -> list[Path]:
    """The tree's Python, but this file: its probes name the old forms on purpose."""
    here = Path(__file__).resolve()
    return sorted(
        path
        for folder in CODE_FOLDERS
        for path in (REPO / folder).rglob("*.py")
        if "__pycache__" not in path.parts and path != here
    )


def old_names(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] == "services"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [node.module] if node.module.split(".")[0] == "services" else []
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and OLD_MODULE.match(node.value):
            found.append(repr(node.value))
        elif isinstance(node, ast.JoinedStr) and node.values:  # f"services.{name}": a module name built
            head = node.values[0]
            if isinstance(head, ast.Constant) and str(head.value).startswith("services."):
                found.append(f"f{str(head.value)!r}...")
    return found


def test_no_code_names_the_old_top_level_package() -> None:
    wrong = [f"{p.relative_to(REPO)}: {name}" for p in python_files() for name in old_names(p)]
    for path in [REPO / "Makefile", *(REPO / "deploy").rglob("*.y*ml"), *(REPO / "deploy").rglob("*.sh")]:
        lines = path.read_text().splitlines()
        wrong += [f"{path.relative_to(REPO)}: {line.strip()}" for line in lines if OLD_COMMAND.search(line)]
    assert not wrong, f"still names the old top-level `services` (now `llmbus_services`): {wrong}"


def test_the_checks_see_every_old_form(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import services.router\nfrom services.gateway import app\nstart('services.scheduler')\n"
        "import llmbus_services.router\nname = 'some_services.x'\nmodule = f'services.{name}.config'\n"
    )
    found = sorted(old_names(probe))
    assert found == sorted(["services.router", "services.gateway", "'services.scheduler'", "f'services.'..."])
    assert OLD_COMMAND.search('command: ["python", "-m", "services.router"]')
    assert OLD_COMMAND.search("python -m services.router")
    assert not OLD_COMMAND.search('command: ["python", "-m", "llmbus_services.router"]')

"""The user documentation names only what exists: topics, make targets, settings, files.

README.md and docs/ describe what is built; these checks fail when the code moves away from them
(a topic added to the catalog, a make target renamed, a setting removed) so the docs are fixed in
the same change.
"""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pytest
from pydantic_settings import BaseSettings

from llmbus.artifacts import CacheSettings
from llmbus.contract import contracts
from llmbus.contract import topics as t
from llmbus.settings import BusSettings, ObjectStoreSettings

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
SERVICE_READMES = sorted((REPO / "services").glob("*/README.md"))
USER_DOCS = [README, *DOCS]
SERVICES = sorted(p.parent.name for p in SERVICE_READMES)
# Files whose literal text may define an environment variable (compose, scripts, the Makefile, code).
CODE_SUFFIXES = {".py", ".sh", ".yml", ".yaml", ".toml", ".j2"}
CODE_NAMES = {"Makefile", "Dockerfile"}


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _name(path: Path) -> str:
    return str(path.relative_to(REPO))


def test_readme_is_a_short_entry() -> None:
    assert len(_text(README).splitlines()) <= 300


@pytest.mark.parametrize("path", USER_DOCS, ids=_name)
def test_no_development_history(path: Path) -> None:
    history = re.compile(r"\b(session|issue|round|wave) \d+\b|\bbefore / after\b", re.IGNORECASE)
    found = [m.group(0) for m in history.finditer(_text(path))]
    assert not found, f"{_name(path)} quotes development history: {found}"


def _topic_table() -> list[list[str]]:
    text = _text(REPO / "docs" / "architecture.md")
    parts = text.split("<!-- topic-table -->")
    assert len(parts) == 3, "docs/architecture.md needs its topic table between two <!-- topic-table --> markers"
    rows = [line for line in parts[1].strip().splitlines() if line.startswith("| `")]
    return [[cell.strip() for cell in row.strip().strip("|").split(" | ")] for row in rows]


def test_architecture_topic_table_is_the_catalog() -> None:
    table = {row[0].strip("`"): row for row in _topic_table()}
    specs = {spec.name: spec for spec in (*t.CATALOG, *t.PATTERN_SPECS)}
    assert sorted(table) == sorted(specs), "docs/architecture.md's topic table must name exactly the catalog's topics"
    for name, (_, key, value, _sizes, flow, _notes) in table.items():
        spec = specs[name]
        assert key == spec.key, f"{name}: key {key!r}, catalog says {spec.key!r}"
        assert value == spec.value.__name__, f"{name}: value {value!r}, catalog says {spec.value.__name__}"
        writers, readers = (
            {w.strip() for w in side.split(",") if w.strip() not in ("", "—")} for side in flow.split("→")
        )
        assert writers == set(spec.writers), f"{name}: writers {writers}, the declarations say {spec.writers}"
        assert readers == set(spec.readers), f"{name}: readers {readers}, the declarations say {spec.readers}"


def test_generated_catalog_has_the_same_topics() -> None:
    generated = json.loads(_text(REPO / "schemas" / "topics.json"))
    assert sorted(entry["name"] for entry in generated) == sorted(row[0].strip("`") for row in _topic_table())


def _make_targets() -> set[str]:
    return set(re.findall(r"^([a-z][a-z0-9-]*):", _text(REPO / "Makefile"), re.MULTILINE))


@pytest.mark.parametrize("path", [*USER_DOCS, *SERVICE_READMES], ids=_name)
def test_every_make_target_named_exists(path: Path) -> None:
    # `make x` in inline code, or at the start of a line inside a code block.
    named = set(re.findall(r"(?:`|^\s*)make ([a-z][a-z0-9-]*)", _text(path), re.MULTILINE))
    missing = named - _make_targets()
    assert not missing, f"{_name(path)} names make targets the Makefile lacks: {sorted(missing)}"


def _service_settings(service: str) -> list[type[BaseSettings]]:
    """The settings classes of a service's config.py (each with its own env prefix)."""
    module = importlib.import_module(f"llmbus_services.{service}.config")
    return [
        obj
        for obj in vars(module).values()
        if isinstance(obj, type) and issubclass(obj, BaseSettings) and obj is not BaseSettings
    ]


def _settings_classes() -> list[type[BaseSettings]]:
    library = [BusSettings, ObjectStoreSettings, CacheSettings]  # LLMBUS_, LLMBUS_S3_, LLMBUS_ARTIFACT_CACHE_
    return [*library, *(cls for service in SERVICES for cls in _service_settings(service))]


def _settings_env() -> tuple[set[str], set[str]]:
    """Every env variable a settings class reads, and the classes' prefixes."""
    names: set[str] = set()
    prefixes: set[str] = set()
    for cls in _settings_classes():
        prefix = str(cls.model_config.get("env_prefix", "")).upper()
        prefixes.add(prefix)
        names |= {prefix + field.upper() for field in cls.model_fields}
    return names, prefixes


def _code_text() -> str:
    skip = {".git", "docs", "node_modules", "__pycache__"}
    chunks = []
    for path in REPO.rglob("*"):
        if skip & set(path.relative_to(REPO).parts) or not path.is_file():
            continue
        if path.suffix in CODE_SUFFIXES or path.name in CODE_NAMES:
            chunks.append(path.read_text(encoding="utf-8", errors="replace"))
    return "\n".join(chunks)


def test_every_llmbus_variable_named_is_real() -> None:
    settings, prefixes = _settings_env()
    code = _code_text()
    problems = []
    for path in [*USER_DOCS, *SERVICE_READMES]:
        for name in sorted(set(re.findall(r"LLMBUS_[A-Z0-9_]*\*?", _text(path)))):
            if name.endswith(("*", "_")):  # a family: LLMBUS_KAFKA_SASL_*, LLMBUS_WORKER_
                stem = name.rstrip("*")
                if stem in prefixes or any(s.startswith(stem) for s in settings):
                    continue
            elif name in settings or re.search(rf"\b{name}\b", code):
                continue
            problems.append(f"{_name(path)}: {name}")
    assert not problems, "named in the docs but read by no setting and no code:\n" + "\n".join(problems)


def test_every_service_has_a_readme() -> None:
    packages = sorted(p.parent.name for p in (REPO / "services").glob("*/__main__.py"))
    assert packages == SERVICES


@pytest.mark.parametrize("path", SERVICE_READMES, ids=_name)
def test_service_readme_names_what_its_declaration_reads_and_writes(path: Path) -> None:
    contract = contracts.BY_SERVICE[path.parent.name.replace("_", "-")]
    text = _text(path)
    # A per-instance topic is named by its family: `llm.dispatch.<worker_id>` as `llm.dispatch.`, and so on.
    missing = sorted(
        topic for topic in contract.read_topics() | contract.write_topics() if topic.split("<")[0] not in text
    )
    assert not missing, f"{_name(path)} does not say that {contract.service} reads or writes {missing}"


@pytest.mark.parametrize("path", SERVICE_READMES, ids=_name)
def test_service_readme_names_its_settings_prefix(path: Path) -> None:
    prefixes = {str(cls.model_config.get("env_prefix", "")) for cls in _service_settings(path.parent.name)}
    assert prefixes and all(prefix in _text(path) for prefix in prefixes), f"{_name(path)} lacks {prefixes}"


def test_performance_page_links_every_report() -> None:
    text = _text(REPO / "docs" / "performance.md")
    linked = set(re.findall(r"\(\.\./bench/reports/([\w.-]+\.md)\)", text))
    reports = {p.name for p in (REPO / "bench" / "reports").glob("*.md")}
    assert linked == reports, f"not linked: {sorted(reports - linked)}; gone: {sorted(linked - reports)}"


@pytest.mark.parametrize("path", [*USER_DOCS, *SERVICE_READMES], ids=_name)
def test_relative_links_resolve(path: Path) -> None:
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", _text(path))
    missing = [
        target
        for target in targets
        if "://" not in target and not target.startswith("mailto:") and not (path.parent / target).exists()
    ]
    assert not missing, f"{_name(path)} links to missing files: {missing}"

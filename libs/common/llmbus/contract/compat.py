"""Additive-only schema evolution, checked: the generated schemas against the released ones.

`schemas/previous/messages/*.json` is the contract as last released. A change to a message
whose `x-llmbus-schema-version` did not go up must keep readers of the released version and
records written by it working: it may add optional fields and enum values; it may not remove a
field, change a field's type (making it nullable included), add a required field or remove an
enum value.
A message whose version went up is a new contract (readers of the old version refuse it), so it
is not compared. schemas/README.md states the rule.

`python -m llmbus.contract.compat` checks (exit 1 with every breaking change listed);
`--accept` then records the current schemas as the released ones (`make schemas-release`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

Schema = dict[str, Any]
VERSION_KEY = "x-llmbus-schema-version"


def _resolve(node: Schema, root: Schema) -> Schema:
    while isinstance(node.get("$ref"), str) and node["$ref"].startswith("#/$defs/"):
        node = root.get("$defs", {}).get(node["$ref"].removeprefix("#/$defs/"), {})
    return node


def _branches(node: Schema, root: Schema) -> list[Schema]:
    """The alternatives a value may take (anyOf/oneOf flattened, refs resolved)."""
    node = _resolve(node, root)
    alternatives = node.get("anyOf") or node.get("oneOf")
    if alternatives:
        return [branch for alt in alternatives for branch in _branches(alt, root)]
    return [node]


def _types(node: Schema) -> set[str]:
    declared = node.get("type")
    if declared is None:
        return {"any"} if "enum" not in node and "const" not in node else set()
    found = {declared} if isinstance(declared, str) else set(declared)
    return found


def _by_type(branches: list[Schema]) -> dict[str, Schema]:
    return {kind: branch for branch in branches for kind in _types(branch)}


def _type_names(by_type: dict[str, Schema]) -> str:
    return "|".join(sorted(by_type)) or "enum"


def _enum_values(branches: list[Schema]) -> set[Any] | None:
    values: set[Any] = set()
    for branch in branches:
        if "enum" in branch:
            values |= {json.dumps(v) for v in branch["enum"]}
        elif "const" in branch:
            values.add(json.dumps(branch["const"]))
        elif branch.get("type") != "null":
            return None  # an open value beside the enum: nothing is restricted
    return values or None


def breaking_changes(previous: Schema, current: Schema, path: str, prev_root: Schema, cur_root: Schema) -> list[str]:
    """What a reader of `previous` would fail on in a record written by `current` (and back)."""
    problems: list[str] = []
    prev_branches, cur_branches = _branches(previous, prev_root), _branches(current, cur_root)
    prev_enum, cur_enum = _enum_values(prev_branches), _enum_values(cur_branches)
    if prev_enum is not None and cur_enum is not None and (removed := prev_enum - cur_enum):
        problems.append(f"{path}: enum value(s) removed: {', '.join(sorted(removed))}")
    prev_types, cur_types = _by_type(prev_branches), _by_type(cur_branches)
    # Equal, not merely wider: an old reader fails on a value of a new type (null included), a new
    # reader on an old record's value of a type it dropped.
    if set(prev_types) != set(cur_types):
        was, now = _type_names(prev_types), _type_names(cur_types)
        problems.append(f"{path}: type changed from {was} to {now}")
    if "object" in prev_types and "object" in cur_types:
        problems += _object_changes(prev_types["object"], cur_types["object"], path, prev_root, cur_root)
    if "array" in prev_types and "array" in cur_types:
        prev_items, cur_items = prev_types["array"].get("items"), cur_types["array"].get("items")
        if isinstance(prev_items, dict) and isinstance(cur_items, dict):
            problems += breaking_changes(prev_items, cur_items, f"{path}[]", prev_root, cur_root)
    return problems


def _object_changes(previous: Schema, current: Schema, path: str, prev_root: Schema, cur_root: Schema) -> list[str]:
    problems: list[str] = []
    prev_fields, cur_fields = previous.get("properties", {}), current.get("properties", {})
    for name, prev_field in sorted(prev_fields.items()):
        where = f"{path}.{name}" if path else name
        if name not in cur_fields:
            problems.append(f"{where}: field removed")
        else:
            problems += breaking_changes(prev_field, cur_fields[name], where, prev_root, cur_root)
    for name in sorted(set(current.get("required", ())) - set(previous.get("required", ()))):
        where = f"{path}.{name}" if path else name
        problems.append(f"{where}: new required field (older writers do not send it)")
    return problems


def check_directory(previous_dir: Path, current_dir: Path) -> list[str]:
    """Every breaking change from the released schemas in `previous_dir` to those in `current_dir`."""
    problems: list[str] = []
    for previous_file in sorted(previous_dir.glob("*.json")):
        message = previous_file.stem
        current_file = current_dir / previous_file.name
        if not current_file.exists():
            problems.append(f"{message}: message removed from the contract")
            continue
        previous, current = json.loads(previous_file.read_text()), json.loads(current_file.read_text())
        if current.get(VERSION_KEY, 1) > previous.get(VERSION_KEY, 1):
            continue  # a new version: its readers are new too
        problems += [f"{message}: {p}" for p in breaking_changes(previous, current, "", previous, current)]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--schemas", type=Path, default=Path("schemas"))
    parser.add_argument("--accept", action="store_true", help="record the current schemas as the released ones")
    args = parser.parse_args(argv)
    previous_dir, current_dir = args.schemas / "previous" / "messages", args.schemas / "messages"
    problems = check_directory(previous_dir, current_dir)
    if problems:
        print(
            f"{len(problems)} breaking change(s) against the released schemas in {previous_dir}/:\n  "
            + "\n  ".join(problems)
            + "\nonly additive changes keep a message's version (schemas/README.md); for an incompatible one, "
            "bump the model's SCHEMA_VERSION",
            file=sys.stderr,
        )
        return 1
    if args.accept:
        shutil.rmtree(previous_dir, ignore_errors=True)
        shutil.copytree(current_dir, previous_dir)
        print(f"released: {len(list(previous_dir.glob('*.json')))} schemas copied to {previous_dir}/")
        return 0
    print(f"schemas compatible with the released ones ({len(list(previous_dir.glob('*.json')))} messages)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

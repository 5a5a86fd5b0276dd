"""YAML configuration files (routing policies, scheduler pipelines, price books, scaling pools):
read once at start-up and validated by strict pydantic models, so a misspelt key fails the start
with its name instead of being ignored."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """A configuration file's model: an unknown key is an error."""

    model_config = ConfigDict(extra="forbid")


M = TypeVar("M", bound=BaseModel)


def read_yaml(path: str | Path) -> Any:
    """`path` read as YAML, not yet validated (an empty file counts as `{}`)."""
    raw = yaml.safe_load(Path(path).read_text())
    return {} if raw is None else raw


def load_yaml(path: str | Path, model: type[M]) -> M:
    """`path` read as YAML and validated by `model`."""
    return model.model_validate(read_yaml(path))


def shipped_or_path(name_or_path: str, folder: Path) -> Path:
    """A shipped file by name (`default` -> folder/default.yaml), or the path given (it has a suffix)."""
    path = Path(name_or_path)
    return path if path.suffix else folder / f"{name_or_path}.yaml"

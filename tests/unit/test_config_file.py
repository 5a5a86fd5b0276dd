"""llmbus.contract.config_file: every service's YAML is read and checked the same strict way."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from llmbus.contract.config_file import StrictModel, load_yaml, shipped_or_path
from llmbus_services.autoscaler.core.config import PoolsFile
from llmbus_services.cost_accounting.core.prices import load_pricebook
from llmbus_services.router.core.config import load_policy
from llmbus_services.scheduler.core.pipeline import Pipeline


class Limits(StrictModel):
    max_tokens: int = 16


def test_a_misspelt_key_is_an_error_and_an_empty_file_is_the_defaults(tmp_path: Path) -> None:
    (tmp_path / "typo.yaml").write_text("max_token: 32\n")
    with pytest.raises(ValidationError, match="max_token"):
        load_yaml(tmp_path / "typo.yaml", Limits)
    (tmp_path / "empty.yaml").write_text("")
    assert load_yaml(tmp_path / "empty.yaml", Limits) == Limits()


def test_a_name_is_a_shipped_file_and_a_path_is_itself(tmp_path: Path) -> None:
    assert shipped_or_path("default", tmp_path) == tmp_path / "default.yaml"
    assert shipped_or_path("/etc/x.yaml", tmp_path) == Path("/etc/x.yaml")


@pytest.mark.parametrize(
    ("load", "shipped"),
    [
        (load_policy, "services/router/policies/default.yaml"),
        (load_pricebook, "services/cost_accounting/policies/default.yaml"),
        (Pipeline.load, "services/scheduler/policies/default.yaml"),
        (PoolsFile.load, "services/autoscaler/policies/default.yaml"),
    ],
)
def test_every_service_refuses_an_unknown_top_level_key(tmp_path: Path, load: object, shipped: str) -> None:
    repo = Path(__file__).resolve().parents[2]
    bad = tmp_path / "bad.yaml"
    bad.write_text((repo / shipped).read_text() + "\nnot_a_setting: 1\n")
    with pytest.raises(ValidationError, match="not_a_setting"):
        load(str(bad))  # type: ignore[operator]

"""llmbus.contract.request_key: a (tenant, request id) pair and back, whatever the id holds."""

from __future__ import annotations

import pytest

from llmbus.contract.request_key import request_id_of, request_key


@pytest.mark.parametrize("request_id", ["r-1", "a:b:c", "{tag}", ""])
def test_the_request_id_comes_back_whole(request_id: str) -> None:
    assert request_id_of(request_key("acme", request_id)) == request_id


def test_two_tenants_one_id_are_two_keys() -> None:
    assert request_key("acme", "r-1") != request_key("globex", "r-1")

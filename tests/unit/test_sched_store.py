"""What the scheduler keeps in Redis survives the round trip into a restarted process."""

from __future__ import annotations

from llmbus.contract.messages import InferenceRequest, RoutedRequest
from llmbus_services.scheduler.adapters.store import decode_placement, encode
from llmbus_services.scheduler.core.types import Placement, SchedRequest


def test_placement_round_trip_keeps_what_recovery_needs() -> None:
    routed = RoutedRequest(
        request=InferenceRequest(prompt="x" * 640, max_tokens=32, tenant="acme", session_id="s1", priority=2), model="m"
    )
    request = SchedRequest.from_routed(routed, arrived_at_ms=1000)
    request.attempt = 2
    request.excluded_workers = {"w1"}
    placement = Placement(request.request_id, 2, "w2", "m", 12, 1500, request, uncached_tokens_est=99)
    back = decode_placement(encode(placement, "s0"), prefix_block_tokens=16, max_prefix_blocks=512)
    assert back is not None
    assert (back.request_id, back.attempt, back.worker_id, back.kv_blocks, back.placed_at_ms) == (
        request.request_id,
        2,
        "w2",
        12,
        1500,
    )
    assert back.request.excluded_workers == {"w1"} and back.request.attempt == 2
    assert back.request.prefix_block_hashes == request.prefix_block_hashes and len(request.prefix_block_hashes) == 10
    assert back.request.routed == routed and back.request.tenant == "acme" and back.request.priority == 2

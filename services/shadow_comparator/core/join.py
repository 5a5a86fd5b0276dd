"""Which pair a result belongs to, and whose feedback joins it (pure).

The router derives a shadow's request id from its primary's.
A shadow copy's id is `<primary id>.shadow.<experiment id>` (shadow_request_id, services/router/core/experiments.py);
ids that would pass 128 characters are hashed there and cannot be joined (counted as
`unjoinable`). The copy keeps its client's tenant, so a pair is joined under the primary's
request key (`<tenant>:<primary id>`, llmbus.contract.request_key): two tenants' requests with the
same id are two pairs.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmbus.contract.messages import InferenceResult
from llmbus.contract.request_key import RequestKey, request_key

SHADOW_MARK = ".shadow."


@dataclass(frozen=True)
class PairRef:
    primary_key: RequestKey  # the primary's tenant and request id
    experiment_id: str | None  # None on the primary side: it may pair with several experiments
    is_shadow: bool

    @property
    def field(self) -> str:
        return f"s:{self.experiment_id}" if self.is_shadow else "p"


def pair_ref(result: InferenceResult) -> PairRef | None:
    if not result.shadow:
        return PairRef(result.request_key, None, False)
    primary_id, mark, experiment_id = result.request_id.rpartition(SHADOW_MARK)
    if not mark or not primary_id or not experiment_id:
        return None
    return PairRef(request_key(result.tenant, primary_id), experiment_id, True)


def feedback_belongs(result_tenant: str | None, feedback_tenant: str) -> bool:
    """Feedback counts only from the tenant whose request it was (the result's tenant).

    A link stored without a tenant (by a comparator before tenants were kept) takes none:
    who asked is unknown, so nobody's word on it can be trusted."""
    return result_tenant is not None and result_tenant == feedback_tenant

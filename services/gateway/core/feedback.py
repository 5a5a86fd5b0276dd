"""The body of `POST /v1/feedback` (llmbus's own endpoint, beside the OpenAI ones).

No `tenant` field: the feedback is the API key's tenant's, like its requests; a body naming one
is refused (extra fields are forbidden) rather than silently ignored.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from llmbus.contract.messages import Feedback


class FeedbackBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    request_id: str = Field(min_length=1, max_length=128, description="the `x-request-id` of the answer")
    score: float = Field(ge=0.0, le=1.0, description="0 (bad) to 1 (good)")
    comment: str | None = Field(default=None, max_length=4000)

    def as_tenants(self, tenant: str) -> Feedback:
        return Feedback(request_id=self.request_id, tenant=tenant, score=self.score, comment=self.comment)

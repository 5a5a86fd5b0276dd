"""The gateway's flows: HTTP requests into messages on the bus, and the bus's replies back.

- completions.py  chat and text completions: the request published, its chunks streamed back (SSE)
- feedback.py     a user's score of an answer onto llm.feedback
- http.py         the routes (FastAPI), readiness, /metrics
"""

from llmbus_services.gateway.flows.completions import Gateway
from llmbus_services.gateway.flows.http import create_app

__all__ = ["Gateway", "create_app"]

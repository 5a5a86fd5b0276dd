"""The node agent's flow: probe the node, judge its health, publish its profile on llm.nodes (profile.py)."""

from llmbus_services.node_agent.flows.profile import NodeAgentHandlers

__all__ = ["NodeAgentHandlers"]

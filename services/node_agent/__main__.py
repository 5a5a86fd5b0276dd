"""`python -m llmbus_services.node_agent`"""

from llmbus.bus import run_service
from llmbus.contract import topics as t
from llmbus_services.node_agent.app import main

if __name__ == "__main__":
    run_service(t.NODE_AGENT, main)

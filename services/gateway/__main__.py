"""`python -m llmbus_services.gateway`"""

from llmbus.bus import run_service
from llmbus.contract import topics as t
from llmbus_services.gateway.app import main

if __name__ == "__main__":
    run_service(t.GATEWAY, main)

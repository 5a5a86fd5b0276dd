"""`python -m services.gateway`"""

from llmbus import topics as t
from llmbus.bus import run_service
from services.gateway.app import main

if __name__ == "__main__":
    run_service(t.GATEWAY, main)

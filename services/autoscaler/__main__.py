"""`python -m llmbus_services.autoscaler`"""

from llmbus.bus import run_service
from llmbus.contract import topics as t
from llmbus_services.autoscaler.app import main

if __name__ == "__main__":
    run_service(t.AUTOSCALER, main)

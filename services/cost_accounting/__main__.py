"""`python -m llmbus_services.cost_accounting`"""

from llmbus.bus import run_service
from llmbus.contract import topics as t
from llmbus_services.cost_accounting.app import main

if __name__ == "__main__":
    run_service(t.COST, main)

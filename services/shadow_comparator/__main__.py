"""`python -m llmbus_services.shadow_comparator`"""

from llmbus.bus import run_service
from llmbus.contract import topics as t
from llmbus_services.shadow_comparator.app import main

if __name__ == "__main__":
    run_service(t.COMPARATOR, main)

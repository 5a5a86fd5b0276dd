"""`python -m services.autoscaler`"""

from llmbus import topics as t
from llmbus.bus import run_service
from services.autoscaler.app import main

if __name__ == "__main__":
    run_service(t.AUTOSCALER, main)

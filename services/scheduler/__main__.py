"""`python -m services.scheduler`"""

from llmbus import topics as t
from llmbus.bus import run_service
from services.scheduler.app import main

if __name__ == "__main__":
    run_service(t.SCHEDULER, main)

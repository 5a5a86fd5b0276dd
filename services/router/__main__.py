"""`python -m services.router`"""

from llmbus import topics as t
from llmbus.bus import run_service
from services.router.app import main

if __name__ == "__main__":
    run_service(t.ROUTER, main)

"""`python -m llmbus_services.archive`"""

from llmbus.bus import run_service
from llmbus.contract import topics as t
from llmbus_services.archive.app import main

if __name__ == "__main__":
    run_service(t.ARCHIVE, main)

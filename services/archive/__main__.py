"""`python -m services.archive`"""

from llmbus import topics as t
from llmbus.bus import run_service
from services.archive.app import main

if __name__ == "__main__":
    run_service(t.ARCHIVE, main)
